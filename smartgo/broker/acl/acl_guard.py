"""The broker's and the registry's ACL guard from the node's settings (acl_enable, acl_file); the
guard itself is smartgo.common.acl_guard. A file that does not load stops the actor's start with
the reason, since a node that was asked to check access must not serve without it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from smartgo.common.acl_check import AclConfigError
from smartgo.common.acl_guard import AclGuard
from smartgo.config import NodeConfig

log = logging.getLogger(__name__)


def acl_path(config: NodeConfig) -> Path:
    return Path(config.acl_file).expanduser() if config.acl_file else config.store_path / "plain_acl.yml"


def node_guard(config: NodeConfig, who: str) -> AclGuard | None:
    """The node's guard when acl_enable is on, else None. A file that does not load is logged
    and raised: a node asked to check access must not serve without it."""
    if not config.acl_enable:
        return None
    try:
        return AclGuard(acl_path(config))
    except (AclConfigError, OSError) as exc:
        log.error("%s: acl_enable is on and the ACL file does not load, so nothing is served: %s", who, exc)
        raise

