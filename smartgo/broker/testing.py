"""Requests a RocketMQ client would send, and small-file node settings: for tests and benchmarks.

The client SDK is a separate area; these build the raw commands so the broker's tests and its
benchmark load generator depend on nothing but the remoting layer.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

from smartgo.actors.testing import ROOT, SUPERVISOR, Node, launch_node
from smartgo.net.codes import PullSysFlag, RequestCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import encode_batch_body, encode_properties
from smartgo.testing import free_port

_uniq = itertools.count(1)
_PREFIX = os.urandom(8).hex().upper()


def uniq_key() -> str:
    """A fresh 32-hex-char message id (UNIQ_KEY's shape)."""
    return f"{_PREFIX}{next(_uniq):016X}"


def message_properties(tags: str | None = None, keys: str | None = None, uniq: str | None = None,
                       extra: dict[str, str] | None = None) -> str:
    props = dict(extra or {})
    if tags:
        props["TAGS"] = tags
    if keys:
        props["KEYS"] = keys
    if uniq:
        props["UNIQ_KEY"] = uniq
    return encode_properties(props).decode()


def send_command(topic: str, body: bytes, *, queue_id: int = 0, tags: str | None = None, keys: str | None = None,
                 uniq: str | None = None, group: str = "test_producer", extra: dict[str, str] | None = None,
                 v1: bool = False, default_queues: int = 4, sys_flag: int = 0) -> RemotingCommand:
    """SEND_MESSAGE_V2 (SEND_MESSAGE with the long field names when v1)."""
    values = [group, topic, "TBW102", str(default_queues), str(queue_id), str(sys_flag),
              str(int(time.time() * 1000)), "0", message_properties(tags, keys, uniq, extra), "0"]
    names = (("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
              "bornTimestamp", "flag", "properties", "reconsumeTimes") if v1 else tuple("abcdefghij"))
    return RemotingCommand(RequestCode.SEND_MESSAGE if v1 else RequestCode.SEND_MESSAGE_V2,
                           ext_fields=dict(zip(names, values)), body=body)


def batch_command(topic: str, items: list[tuple[bytes, str]], *, queue_id: int = 0,
                  group: str = "test_producer") -> RemotingCommand:
    """SEND_BATCH_MESSAGE of (body, properties string) items."""
    body = encode_batch_body([(b, 0, p.encode()) for b, p in items])
    ext = dict(zip("abcdefghijm", [group, topic, "TBW102", "4", str(queue_id), "0", str(int(time.time() * 1000)),
                                   "0", "", "0", "true"]))
    return RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, ext_fields=ext, body=body)


def pull_command(topic: str, queue_id: int, offset: int, *, max_nums: int = 32, suspend_ms: int | None = None,
                 subscription: str | None = None, group: str = "test_consumer") -> RemotingCommand:
    sys_flag = (PullSysFlag.SUSPEND if suspend_ms is not None else 0) | \
        (PullSysFlag.SUBSCRIPTION if subscription is not None else 0)
    ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
           "maxMsgNums": str(max_nums), "sysFlag": str(sys_flag), "commitOffset": "0",
           "suspendTimeoutMillis": str(suspend_ms or 0), "subVersion": "0"}
    if subscription is not None:
        ext["subscription"] = subscription
        ext["expressionType"] = "TAG"
    return RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=ext)


def offset_command(code: int, topic: str, queue_id: int, **extra: object) -> RemotingCommand:
    return RemotingCommand(code, ext_fields={"topic": topic, "queueId": str(queue_id),
                                             **{k: str(v) for k, v in extra.items()}})


# Small files and fast supervision for test nodes (the defaults are 1 GiB CommitLog files and a
# 420 MB index file).
SMALL_NODE = {
    "commitlog_file_size": 1 << 20,
    "consume_queue_file_size": 20 * 4000,
    "index_slot_count": 4000,
    "index_entry_count": 20000,
    "vip_port": 0,
    "cq_flush_interval": 0.2,
    "cleanup_interval": 0.2,
    "hold_check_interval": 1.0,
}


def start_broker(base: Path, settings: dict | None = None, wait: bool = True) -> Node:
    """A master node with an embedded registry on free ports; `node.port` is the broker's port and
    `node.registry_port` the registry's."""
    registry_port = free_port()
    node = launch_node(base, {**SMALL_NODE, "embedded_registry_port": registry_port, **(settings or {})},
                       role="master", wait=wait)
    node.registry_port = registry_port       # type: ignore[attr-defined]
    return node


def restart_broker(node: Node) -> Node:
    """Start the node again on its store dir, config file and ports (after it stopped or was killed)."""
    config = node.store.with_name(node.store.name + ".toml")
    cmd = [sys.executable, str(SUPERVISOR), "--role", "master", "--store-dir", str(node.store), "--config",
           str(config), "--listen-host", "127.0.0.1", "--listen-port", str(node.port)]
    with open(node.stderr, "ab") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, cwd=ROOT)
    again = Node(proc, node.store, node.port, node.stderr)
    again.registry_port = node.registry_port      # type: ignore[attr-defined]
    try:
        again.wait_healthy()
    except BaseException:
        again.reap()
        raise
    return again
