"""GET_NAMESRV_CONFIG (319) and UPDATE_NAMESRV_CONFIG (318): the registry's settings as Java
properties text, and the one a running registry may change (mqadmin getNamesrvConfig,
updateNamesrvConfig).

That one is orderMessageEnable, 4.x's switch for putting a topic's ORDER_TOPIC_CONFIG in its
route: off by default in 4.x, whose runbooks turn it on with `mqadmin updateNamesrvConfig -k
orderMessageEnable -v true`; on by default here, so an ordered topic routes as it was made. A
change is persisted to <store>/namesrv.json (4.x: namesrv.properties), which a restarted registry
reads. The names 4.x keeps from an update (configBlackList) are refused with its remark and
NO_PERMISSION; any other name but orderMessageEnable with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

from smartgo.common.bodies import BodyError
from smartgo.common.persist import PersistedFile
from smartgo.common.properties import parse_flag
from smartgo.config import setting_text

FILE = "namesrv.json"
ORDER_MESSAGE_ENABLE = "orderMessageEnable"
BLACK_LIST = frozenset({"configBlackList", "configStorePath", "kvConfigPath"})   # 4.x's configBlackList


class BlackListed(BodyError):
    """An update names a setting 4.x never lets change over the wire."""


class RegistryConfig:
    """The registry's runtime settings, persisted; `fixed` are the ones only a restart changes."""

    def __init__(self, store_dir: Path) -> None:
        self.file = PersistedFile(Path(store_dir) / FILE)
        self.order_message_enable = True
        self.fixed: dict[str, str] = {}

    def load(self) -> None:
        saved = self.file.load(json.loads, "registry config")
        if isinstance(saved, dict) and isinstance(saved.get(ORDER_MESSAGE_ENABLE), bool):
            self.order_message_enable = saved[ORDER_MESSAGE_ENABLE]

    def properties_text(self) -> str:
        settings = {**self.fixed, ORDER_MESSAGE_ENABLE: setting_text(self.order_message_enable)}
        return "".join(f"{k}={v}\n" for k, v in sorted(settings.items()))

    def update(self, props: dict[str, str]) -> dict[str, object]:
        """Check every name first, then apply and persist; returns what changed."""
        if BLACK_LIST & props.keys():
            raise BlackListed("Can not update config in black list.")
        for key in props:
            if key != ORDER_MESSAGE_ENABLE:
                reason = "only a restart changes it" if key in self.fixed else "unknown setting"
                raise BodyError(f"registry config: {key}: {reason}; changeable: {ORDER_MESSAGE_ENABLE}")
        value = props[ORDER_MESSAGE_ENABLE]
        try:
            enable = parse_flag(value)
        except ValueError as exc:
            raise BodyError(f"registry config: {ORDER_MESSAGE_ENABLE}={value[:40]!r}: {exc}") from None
        if enable == self.order_message_enable:
            return {}
        self.file.save(json.dumps({ORDER_MESSAGE_ENABLE: enable}).encode())     # a full disk changes nothing
        self.order_message_enable = enable
        return {ORDER_MESSAGE_ENABLE: enable}
