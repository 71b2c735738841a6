"""GET_BROKER_CONFIG (26) and UPDATE_BROKER_CONFIG (25): the broker's settings as Java
properties text, and the few that may change while it runs.

GET answers every setting of the node (NodeConfig, snake_case names, as in the TOML file) as
`name=value` lines. UPDATE takes `name=value` lines; a name may also be RocketMQ's for the same
setting. Only RUNTIME settings change (brokerPermission, autoCreateTopicEnable,
autoCreateSubscriptionGroup); any other name, an unknown one or a bad value refuses the whole
update with a remark naming it. Accepted changes apply at once and are persisted to
<store>/config/brokerConfig.json, which a restarted broker applies over its settings (as
RocketMQ rewrites its broker.conf).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from smartgo.common.bodies import BodyError
from smartgo.common.persist import PersistedFile
from smartgo.common.properties import parse_flag
from smartgo.config import NodeConfig, setting_text

FILE = Path("config") / "brokerConfig.json"


def _perm(value: str) -> int:
    perm = int(value)
    if not 0 <= perm <= 7:
        raise ValueError("a permission is 0..7 (READ 4 | WRITE 2 | INHERIT 1)")
    return perm


@dataclass(frozen=True)
class Runtime:
    name: str                   # NodeConfig field
    rocketmq: str               # BrokerConfig field
    parse: Callable[[str], object]


RUNTIME = (Runtime("broker_permission", "brokerPermission", _perm),
           Runtime("auto_create_topic", "autoCreateTopicEnable", parse_flag),
           Runtime("auto_create_subscription_group", "autoCreateSubscriptionGroup", parse_flag))
_BY_NAME = {r.name: r for r in RUNTIME} | {r.rocketmq: r for r in RUNTIME}
_FIELDS = {f.name for f in dataclasses.fields(NodeConfig) if f.name != "actor"}


def properties_text(config: NodeConfig) -> str:
    return "".join(f"{name}={setting_text(getattr(config, name))}\n" for name in sorted(_FIELDS))


def check_updates(props: dict[str, str]) -> dict[str, object]:
    """NodeConfig field -> new value; BodyError names the first key that cannot change."""
    changes = {}
    for key, value in props.items():
        r = _BY_NAME.get(key)
        if r is None:
            if key in _FIELDS:
                raise BodyError(f"broker config: {key} cannot change while the broker runs (set it in the config "
                                f"file and restart); changeable: {', '.join(x.name for x in RUNTIME)}")
            raise BodyError(f"broker config: unknown setting {key!r}")
        try:
            changes[r.name] = r.parse(value)
        except ValueError as exc:
            raise BodyError(f"broker config: {key}={value[:40]!r}: {exc}") from None
    return changes


class RuntimeConfig:
    """The node's settings with the runtime changes applied; persisted, versioned."""

    def __init__(self, base: NodeConfig, store_path: Path) -> None:
        self.file = PersistedFile(store_path / FILE)
        self.overrides: dict[str, object] = self.file.load(_load_overrides, "broker config overrides") or {}
        self.config = dataclasses.replace(base, **self.overrides)  # type: ignore[arg-type]  # settings by name
        self.version = 0
        self.timestamp = time.time_ns() // 1_000_000

    def update(self, changes: dict[str, object]) -> dict[str, object]:
        """Apply and persist; returns the settings whose value changed."""
        changed = {k: v for k, v in changes.items() if getattr(self.config, k) != v}
        if changed:
            self.overrides.update(changed)
            self.file.save(json.dumps(_saved(self.overrides), sort_keys=True).encode())
            self.config = dataclasses.replace(self.config, **changed)  # type: ignore[arg-type]  # settings by name
            self.version += 1
            self.timestamp = time.time_ns() // 1_000_000
        return changed

    def version_json(self) -> str:
        return json.dumps({"counter": self.version, "timestamp": self.timestamp}, separators=(",", ":"))


def _saved(overrides: dict[str, object]) -> dict[str, object]:
    """What brokerConfig.json holds: flags as the strings "true"/"false", as ever."""
    return {k: setting_text(v) if isinstance(v, bool) else v for k, v in overrides.items()}


def _load_overrides(raw: bytes) -> dict[str, object]:
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        raise TypeError("not an object")
    return check_updates({k: str(v) for k, v in obj.items()})
