"""Requests a RocketMQ client would send, and small-file node settings: for tests and benchmarks.

The client SDK is a separate area; these build the raw commands so the broker's tests and its
benchmark load generator depend on nothing but the remoting layer.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.nodes import ROOT, SUPERVISOR, Node, launch_node
from smartgo.net import fastjson
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import CURRENT_VERSION, FLAG_ONEWAY, LanguageCode, PullSysFlag, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.java_hash import java_hash
from smartgo.store.record import TRANSACTION_COMMIT_TYPE, encode_batch_body, encode_properties, parse_offset_msg_id
from tests.support.waits import free_port, free_ports, steady_disk_usage

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


def end_transaction_command(prepared: RemotingCommand, group: str, ending: int = TRANSACTION_COMMIT_TYPE,
                            checked: bool = False, **overrides: str) -> RemotingCommand:
    """END_TRANSACTION as DefaultMQProducerImpl sends it, for a prepare's reply (the half's queue offset
    and offsetMsgId) or, checked, a CHECK_TRANSACTION_STATE's header."""
    ext: dict[str, str] = prepared.ext_fields  # type: ignore[assignment]  # a prepare's reply has fields
    if checked:
        table, offset, msg_id = ext["tranStateTableOffset"], ext["commitLogOffset"], ext["msgId"]
    else:
        table, offset, msg_id = ext["queueOffset"], str(parse_offset_msg_id(ext["msgId"])[2]), ext["msgId"]
    return RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
        "producerGroup": group, "tranStateTableOffset": table, "commitLogOffset": offset,
        "commitOrRollback": str(ending), "fromTransactionCheck": str(checked).lower(), "msgId": msg_id,
        "transactionId": ext.get("transactionId", msg_id), **overrides})


def pull_command(topic: str, queue_id: int, offset: int, *, max_nums: int = 32, suspend_ms: int | None = None,
                 subscription: str | None = "*", group: str = "test_consumer", commit_offset: int | None = None,
                 sub_version: int = 0, expression_type: str = "TAG") -> RemotingCommand:
    """PULL_MESSAGE; with a subscription (default "*") it carries FLAG_SUBSCRIPTION, as a pull
    consumer's does; subscription=None relies on what the group registered by HEART_BEAT."""
    sys_flag = (PullSysFlag.SUSPEND if suspend_ms is not None else 0) | \
        (PullSysFlag.SUBSCRIPTION if subscription is not None else 0) | \
        (PullSysFlag.COMMIT_OFFSET if commit_offset is not None else 0)
    ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
           "maxMsgNums": str(max_nums), "sysFlag": str(sys_flag), "commitOffset": str(commit_offset or 0),
           "suspendTimeoutMillis": str(suspend_ms or 0), "subVersion": str(sub_version)}
    if subscription is not None:
        ext["subscription"] = subscription
        ext["expressionType"] = expression_type
    return RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=ext)


def offset_command(code: int, topic: str, queue_id: int, **extra: object) -> RemotingCommand:
    return RemotingCommand(code, ext_fields={"topic": topic, "queueId": str(queue_id),
                                             **{k: str(v) for k, v in extra.items()}})


def stats_records(store: Path) -> list[dict]:
    """Every record in a node's stats folder, oldest file first (a torn line raises)."""
    out = []
    for path in sorted((store / "stats").glob("*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def subscription_json(topic: str, expression: str = "*", version: int | None = None,
                      expression_type: str = "TAG") -> dict:
    """SubscriptionData as the Java client writes it (FilterAPI.build: tags, or SQL92 as is)."""
    tags = [] if expression.strip() == "*" or expression_type != "TAG" else \
        [t.strip() for t in expression.split("||") if t.strip()]
    return {"classFilterMode": False, "codeSet": [java_hash(t) for t in tags], "expressionType": expression_type,
            "subString": expression, "subVersion": int(time.time() * 1000) if version is None else version,
            "tagsSet": tags, "topic": topic}


def heartbeat_body(client_id: str, consumers: dict[str, dict[str, str]] | None = None,
                   producers: tuple[str, ...] = (), model: str = "CLUSTERING", version: int | None = None,
                   expression_type: str = "TAG") -> bytes:
    """HeartbeatData: consumers = {group: {topic: expression}}, every expression of one type."""
    return fastjson.dumps({
        "clientID": client_id,
        "consumerDataSet": [{"consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
                             "groupName": g, "messageModel": model, "unitMode": False,
                             "subscriptionDataSet": [subscription_json(t, e, version, expression_type)
                                                     for t, e in subs.items()]}
                            for g, subs in (consumers or {}).items()],
        "producerDataSet": [{"groupName": g} for g in producers]})


def group_command(code: int, group: str, **extra: object) -> RemotingCommand:
    """A request whose header is consumerGroup (+ extra fields)."""
    return RemotingCommand(code, ext_fields={"consumerGroup": group, **{k: str(v) for k, v in extra.items()}})


def update_offset_command(group: str, topic: str, queue_id: int, offset: int, oneway: bool = False) -> RemotingCommand:
    cmd = group_command(RequestCode.UPDATE_CONSUMER_OFFSET, group, topic=topic, queueId=queue_id, commitOffset=offset)
    cmd.flag = FLAG_ONEWAY if oneway else 0
    return cmd


class ClientStub:
    """One client connection to a broker: heartbeats, and the NOTIFY_CONSUMER_IDS_CHANGED and
    RESET_CONSUMER_CLIENT_OFFSET requests it gets. GET_CONSUMER_RUNNING_INFO,
    CONSUME_MESSAGE_DIRECTLY and GET_CONSUMER_STATUS_FROM_CLIENT are recorded in `relayed` and
    answered by `answer` (a coroutine function; by default SUCCESS with the body b'{"stub":true}')."""

    def __init__(self, addr: str, client_id: str) -> None:
        self.addr = addr
        self.client_id = client_id
        self.notified: list[str] = []
        self.resets: list[RemotingCommand] = []
        self.relayed: list[RemotingCommand] = []
        self.answer = self._stub_answer
        self._lock = threading.Lock()
        self.remoting = BlockingRemotingClient(processors={RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._notify,
                                                           RequestCode.RESET_CONSUMER_CLIENT_OFFSET: self._reset,
                                                           RequestCode.GET_CONSUMER_RUNNING_INFO: self._relayed,
                                                           RequestCode.CONSUME_MESSAGE_DIRECTLY: self._relayed,
                                                           RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT: self._relayed})

    @staticmethod
    async def _stub_answer(conn, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(ResponseCode.SUCCESS, body=b'{"stub":true}')

    async def _relayed(self, conn, cmd: RemotingCommand) -> RemotingCommand | None:
        with self._lock:
            self.relayed.append(cmd)
        return await self.answer(conn, cmd)

    async def _notify(self, conn, cmd: RemotingCommand) -> None:
        with self._lock:
            self.notified.append((cmd.ext_fields or {}).get("consumerGroup", ""))

    async def _reset(self, conn, cmd: RemotingCommand) -> None:
        with self._lock:
            self.resets.append(cmd)

    def notifications(self, group: str) -> int:
        with self._lock:
            return self.notified.count(group)

    def call(self, cmd: RemotingCommand, timeout: float = 5.0) -> RemotingCommand:
        return self.remoting.invoke(self.addr, cmd, timeout)

    def heartbeat(self, consumers: dict[str, dict[str, str]] | None = None, language: int = LanguageCode.PYTHON,
                  client_version: int = CURRENT_VERSION, **kw: object) -> RemotingCommand:
        body = heartbeat_body(self.client_id, consumers, **kw)  # type: ignore[arg-type]  # kw: heartbeat_body's
        return self.call(RemotingCommand(RequestCode.HEART_BEAT, language, client_version, body=body))

    def unregister(self, consumer_group: str) -> RemotingCommand:
        return self.call(RemotingCommand(RequestCode.UNREGISTER_CLIENT, ext_fields={
            "clientID": self.client_id, "consumerGroup": consumer_group}))

    def close(self) -> None:
        self.remoting.close()


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


# A settings value for metrics_port: a free port picked at each start attempt (node.metrics_port)
FREE_PORT = -1


def _metrics_port(settings: dict, picked: dict) -> dict:
    """settings with a FREE_PORT metrics_port replaced by a fresh free port (kept in picked)."""
    if settings.get("metrics_port") != FREE_PORT:
        return settings
    picked["metrics_port"] = free_port()
    return {**settings, "metrics_port": picked["metrics_port"]}


def start_broker(base: Path, settings: dict | None = None, wait: bool = True, launcher: Path = SUPERVISOR) -> Node:
    """A master node with an embedded registry on free ports; `node.port` is the broker's port,
    `node.registry_port` the registry's and `node.metrics_port` the metrics page's (FREE_PORT)."""
    usage = steady_disk_usage(base.with_name(base.name + ".disk_usage"))
    picked: dict = {}

    def node_settings() -> dict:                # fresh ports at each attempt
        picked["embedded_registry_port"], picked["ha_port"] = free_ports(2)
        return _metrics_port({**SMALL_NODE, "disk_usage_file": usage, **picked, **(settings or {})}, picked)

    node = launch_node(base, node_settings, role="master", wait=wait, launcher=launcher)
    used = {**picked, **(settings or {})}
    node.registry_port = used["embedded_registry_port"]  # type: ignore[attr-defined]  # a broker's port
    node.ha_port = used["ha_port"]  # type: ignore[attr-defined]  # a broker's port
    metrics_port = picked.get("metrics_port", used.get("metrics_port", 0))
    node.metrics_port = metrics_port  # type: ignore[attr-defined]  # a broker's port
    return node


def committed_total(addr: str, topic: str, group: str, queues: int) -> int | None:
    """The sum of a group's committed offsets over a topic's queues at one broker (None while a
    queue has none)."""
    client = BlockingRemotingClient()
    try:
        total = 0
        for q in range(queues):
            r = client.invoke(addr, offset_command(RequestCode.QUERY_CONSUMER_OFFSET, topic, q, consumerGroup=group))
            if r.code != ResponseCode.SUCCESS:
                return None
            total += int(r.ext_fields["offset"])  # type: ignore[index]  # SUCCESS: has the field
        return total
    finally:
        client.close()


def start_slave(base: Path, master: Node, settings: dict | None = None) -> Node:
    """A slave (brokerId 1) of `master`: registers with the master's embedded registry, which
    tells it where to replicate from."""
    usage = steady_disk_usage(base.with_name(base.name + ".disk_usage"))
    picked: dict = {}
    node = launch_node(base, lambda: _metrics_port({
        **SMALL_NODE, "disk_usage_file": usage, "ha_port": free_port(),
        "registry": f"127.0.0.1:{master.registry_port}",  # type: ignore[attr-defined]  # a broker's port
        "slave_sync_interval": 0.5, **(settings or {})}, picked), role="slave")
    node.registry_port = master.registry_port  # type: ignore[attr-defined]  # a broker's port
    metrics_port = picked.get("metrics_port", (settings or {}).get("metrics_port", 0))
    node.metrics_port = metrics_port  # type: ignore[attr-defined]  # a broker's port
    return node


def restart_broker(node: Node, role: str = "master") -> Node:
    """Start the node again on its store dir, config file and ports (after it stopped or was killed)."""
    config = node.store.with_name(node.store.name + ".toml")
    cmd = [sys.executable, str(SUPERVISOR), "--role", role, "--store-dir", str(node.store), "--config",
           str(config), "--listen-host", "127.0.0.1", "--listen-port", str(node.port)]
    with open(node.stderr, "ab") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, cwd=ROOT)
    again = Node(proc, node.store, node.port, node.stderr)
    again.registry_port = getattr(node, "registry_port", 0)  # type: ignore[attr-defined]  # a broker's port
    again.ha_port = getattr(node, "ha_port", 0)  # type: ignore[attr-defined]  # a broker's port
    again.metrics_port = getattr(node, "metrics_port", 0)  # type: ignore[attr-defined]  # a broker's port
    try:
        again.wait_healthy()
    except BaseException:
        again.reap()
        raise
    return again


# ---- the Prometheus endpoint (metrics_port) --------------------------------------------------------------
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a page, checked against the format: each line a comment or a sample, each
    sample under a TYPE line of its family, label values unescaped."""
    samples: dict[tuple[str, frozenset], float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram") and name not in types
            types[name] = kind
            continue
        if line.startswith("# HELP ") or not line:
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, _, body, value = m.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
        assert family in types, f"{name} has no TYPE line"
        labels = {}
        pos = 0
        while body and pos < len(body):
            lm = _LABEL.match(body, pos)
            assert lm, f"bad labels in {line!r}"
            labels[lm.group(1)] = re.sub(r"\\(.)", lambda e: {"n": "\n"}.get(e.group(1), e.group(1)), lm.group(2))
            pos = lm.end()
        samples[(name, frozenset(labels.items()))] = float(value)
    return samples


def metric_value(samples: dict, name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels` (None when there is none)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name} {labels} matches {len(found)} samples"
    return found[0] if found else None


def scrape_metrics(port: int, path: str = "/metrics") -> tuple[int, str, str]:
    """(status, content type, text) of a GET on a node's metrics port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()
