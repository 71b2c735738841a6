"""The edits 4.x's PlainPermissionManager makes to plain_acl.yml for the ACL admin requests
(UPDATE_AND_CREATE_ACL_CONFIG, DELETE_ACL_CONFIG, UPDATE_GLOBAL_WHITE_ADDRS_CONFIG), and what
GET_BROKER_CLUSTER_ACL_INFO / GET_BROKER_CLUSTER_ACL_CONFIG read from it: text in, text out, no
file access (smartgo.broker.processor.acl_processor reads and writes the file).

As in 4.x, every edit bumps the file's `dataVersion: [{counter, timestamp}]` and rewrites the whole
file, so comments are lost. Unlike 4.x, an edit whose result smartgo.common.acl_check.parse_acl refuses is
refused with that reason and nothing is written: a file the net actors cannot load would leave
them on the old rules with nobody told.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from smartgo.common.acl_check import KEY_MIN_LENGTH, parse_acl
from smartgo.common.acl_sign import ACCESS_CONFIG_FIELDS, AccessConfig


ACCOUNTS = "accounts"
GLOBAL_WHITE = "globalWhiteRemoteAddresses"
DATA_VERSION = "dataVersion"


class AclEditError(ValueError):
    """An edit that cannot be made; str() says why."""


def _apply(change: AccessConfig, account: dict[str, Any]) -> None:
    """createAclAccessConfigMap: the given fields over the account's."""
    for name, value in zip(ACCESS_CONFIG_FIELDS, change.values()):
        if value is not None:
            account[name] = value


def load(text: str, source: str) -> dict[str, Any]:
    """The file as a mapping (empty for an empty file); AclEditError when it is not one."""
    import yaml                         # as smartgo.common.acl_check: only a node with ACL on reads YAML
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AclEditError(f"{source}: not valid YAML, fix it by hand first: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise AclEditError(f"{source}: not a mapping of {GLOBAL_WHITE} and {ACCOUNTS}, fix it by hand first")
    return doc


def data_version(doc: Mapping[str, Any], default_timestamp: int) -> tuple[int, int]:
    """(counter, timestamp) of the file's dataVersion; (0, default_timestamp) when it has none
    (4.x: a new DataVersion, stamped when it loaded the file)."""
    versions = doc.get(DATA_VERSION)
    first = versions[0] if isinstance(versions, list) and versions else None
    if isinstance(first, dict):
        try:
            return int(first.get("counter") or 0), int(first.get("timestamp") or default_timestamp)
        except (TypeError, ValueError):
            pass
    return 0, default_timestamp


def _accounts(doc: dict[str, Any], source: str) -> list:
    accounts = doc.get(ACCOUNTS)
    if accounts is None:
        accounts = doc[ACCOUNTS] = []
    if not isinstance(accounts, list):
        raise AclEditError(f"{source}: {ACCOUNTS} is not a list, fix it by hand first")
    return accounts


def _find(accounts: list, access_key: str) -> int | None:
    for i, account in enumerate(accounts):
        if isinstance(account, dict) and str(account.get("accessKey")) == access_key:
            return i
    return None


def _edited(text: str, source: str, now_ms: int, edit: Callable[[dict[str, Any]], None]) -> str:
    """The file after `edit`, with its dataVersion bumped (updateAclConfigFileVersion), as YAML
    that smartgo.common.acl_check loads (AclConfigError otherwise)."""
    import yaml
    doc = load(text, source)
    edit(doc)
    counter, _ = data_version(doc, now_ms)
    doc[DATA_VERSION] = [{"counter": counter + 1, "timestamp": now_ms}]
    out = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True)
    parse_acl(out, source)
    return out


def update_account(text: str, update: AccessConfig, source: str, now_ms: int) -> str:
    """UPDATE_AND_CREATE_ACL_CONFIG: the account with update's accessKey changed in place, or
    appended when the file has none (it then needs a secretKey)."""
    if len(update.access_key) <= KEY_MIN_LENGTH:
        raise AclEditError(f"The accessKey={update.access_key} cannot be null and length should longer than "
                           f"{KEY_MIN_LENGTH}")

    def edit(doc: dict[str, Any]) -> None:
        accounts = _accounts(doc, source)
        at = _find(accounts, update.access_key)
        if at is None:
            if update.secret_key is None:
                raise AclEditError(f"{source} has no account {update.access_key}: a new account needs a secretKey")
            account: dict[str, Any] = {"accessKey": update.access_key, "secretKey": update.secret_key,
                                       "admin": False}
            _apply(update, account)
            accounts.append({name: account[name] for name in ACCESS_CONFIG_FIELDS if name in account})
        else:
            _apply(update, accounts[at])
    return _edited(text, source, now_ms, edit)


def delete_account(text: str, access_key: str, source: str, now_ms: int) -> str:
    """DELETE_ACL_CONFIG: the file without the account."""
    def edit(doc: dict[str, Any]) -> None:
        accounts = _accounts(doc, source)
        at = _find(accounts, access_key)
        if at is None:
            raise AclEditError(f"{source} has no account with accessKey {access_key!r}")
        del accounts[at]
    return _edited(text, source, now_ms, edit)


def set_global_white(text: str, addresses: list[str], source: str, now_ms: int) -> str:
    """UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: the global white list replaced by `addresses`."""
    def edit(doc: dict[str, Any]) -> None:
        doc[GLOBAL_WHITE] = list(addresses)
    return _edited(text, source, now_ms, edit)


def _text(value: Any) -> Any:
    if isinstance(value, list):
        return [_text(v) for v in value]
    return value if isinstance(value, (str, bool)) else str(value)


def config_body(text: str, source: str) -> dict[str, Any]:
    """GetBrokerClusterAclConfigResponseBody: the global white list and every account as the
    file has it (secret keys included, as 4.x; the request is admin-only here)."""
    parse_acl(text, source)                 # AclConfigError: the file is not one the broker runs on
    doc = load(text, source)
    accounts = []
    for account in doc.get(ACCOUNTS) or []:
        out: dict[str, Any] = {name: _text(account[name]) for name in ACCESS_CONFIG_FIELDS
                               if name != "admin" and account.get(name) is not None}
        out["admin"] = str(account.get("admin")).lower() == "true"
        accounts.append(dict(sorted(out.items())))
    return {"globalWhiteAddrs": [_text(a) for a in doc.get(GLOBAL_WHITE) or [] if a is not None],
            "plainAccessConfigs": accounts}

