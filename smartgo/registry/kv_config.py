"""Namespaced key/value configuration, persisted to kvConfig.json (RocketMQ's KVConfigManager).

Ordered topics live here (namespace ORDER_TOPIC_CONFIG, key topic, value "brokerName:queueNum;..."),
so it is the registry's only durable state. Every change rewrites the file atomically: a temp
file is written and fsynced, then renamed over the old one and the directory fsynced, so a crash
leaves either the old or the new file, never a torn one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "kvConfig.json"


class KVConfigManager:
    def __init__(self, store_dir: Path) -> None:
        self.path = Path(store_dir) / FILE_NAME
        self.table: dict[str, dict[str, str]] = {}
        self.version = 0

    def load(self) -> None:
        """Read kvConfig.json ({"configTable": {namespace: {key: value}}}) if it exists.

        A file that does not parse is moved aside (kvConfig.json.corrupt-<time>) with an error in
        the log and the registry starts empty: routes come back with the next broker registrations.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            table = _validate(json.loads(raw))
        except (ValueError, RecursionError) as exc:
            aside = self.path.with_name(f"{FILE_NAME}.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            log.error("%s is corrupt (%s); moved it to %s and starting with an empty KV config",
                      self.path, exc, aside)
            return
        self.table = table
        self.version += 1
        log.info("loaded %d KV namespaces from %s", len(table), self.path)

    def put(self, namespace: str, key: str, value: str) -> None:
        self.table.setdefault(namespace, {})[key] = value
        self._changed()
        log.info("put KV config %s %s=%s", namespace, key, value)

    def get(self, namespace: str, key: str) -> str | None:
        return self.table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> None:
        items = self.table.get(namespace)
        if items is None or key not in items:
            return
        del items[key]
        if not items:
            del self.table[namespace]
        self._changed()
        log.info("deleted KV config %s %s", namespace, key)

    def namespace(self, namespace: str) -> dict[str, str] | None:
        return self.table.get(namespace)

    def _changed(self) -> None:
        self.version += 1
        self.persist()

    def persist(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"configTable": self.table}, indent=1, sort_keys=True).encode("utf-8")
        tmp = self.path.with_name(f"{FILE_NAME}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _validate(obj: object) -> dict[str, dict[str, str]]:
    if not isinstance(obj, dict) or not isinstance(obj.get("configTable", {}), dict):
        raise ValueError('expected {"configTable": {namespace: {key: value}}}')
    table = obj.get("configTable", {})
    for namespace, items in table.items():
        if not isinstance(items, dict) or not all(isinstance(v, str) for v in items.values()):
            raise ValueError(f"namespace {namespace!r} is not a map of strings")
    return table
