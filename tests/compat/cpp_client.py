"""Drive the RocketMQ C++ client (PyPI `rocketmq` 0.4.4: librocketmq, rocketmq-client-cpp 1.2, through
ctypes) from a JSON spec given as argv[1]; print one JSON document on the last line of stdout.

It runs in a process of its own: the native client keeps threads of its own, logs under
$HOME/logs/rocketmq-cpp and can crash, and a crash must fail one test, not the test runner.
Ops run in order; each result is {"ok": true, "value": ...} or {"ok": false, "error": "..."}.

    {"op": "send", "topic", "group", "mode": sync|async|oneway|orderly|batch, "n", "tags": [...],
     "bodySize": 0, "delayLevel": 0, "properties": {}, "arg": 0}
        -> [{status, msgId, offset}] (none for oneway)
    {"op": "push", "topic", "group", "expression", "expect", "model": CLUSTERING|BROADCASTING,
     "orderly": false, "failFirst": 0, "timeoutS": 30, "settleS": 0, "sendAfterStart": {send op}}
        -> [message]: what the listener took, up to `expect`, and a first one beyond it if it came
        within `settleS` (a duplicate; the wait ends there).
        failFirst: the first k deliveries throw (RECONSUME_LATER). sendAfterStart: once the
        consumer is pulling (proved by tag "Probe" messages sent every 0.2 s until one arrives;
        they are not returned), send these: a broadcasting consumer starts at the queues' ends.
    {"op": "pull", "topic", "group", "expression"}       -> [message]
    {"op": "sendFor", "topic", "group", "seconds", "intervalMs": 50}
        -> [{at (wall clock s), status, msgId} or {at, error}]: one sync send at a time for that
        long, a failed one included (what an application sees through a broker's role change)
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from rocketmq.client import Message, MessageModel, Producer, PullConsumer, PushConsumer


def _message(m) -> dict:
    return {"topic": m.topic, "tags": m.tags.decode(), "keys": m.keys.decode(), "body": m.body.decode("latin-1"),
            "msgId": m.id, "queueId": m.queue_id, "queueOffset": m.queue_offset, "idx": m.get_property("idx").decode(),
            "reconsumeTimes": m.reconsume_times, "storeTimestamp": m.store_timestamp,
            "bornTimestamp": m.born_timestamp, "commitLogOffset": m.commit_log_offset}


def _build(spec: dict, i: int) -> Message:
    m = Message(spec["topic"])
    tags = spec.get("tags") or ["TagA"]
    m.set_tags(tags[i % len(tags)])
    m.set_keys(f"cpp-key-{i}")
    m.set_property("idx", str(i))
    size = spec.get("bodySize", 0)
    m.set_body((f"cpp-{i}-" * (size // 6 + 1))[:size] if size else f"cpp-{i}")
    if spec.get("delayLevel"):
        m.set_delay_time_level(spec["delayLevel"])
    for name, value in spec.get("properties", {}).items():
        m.set_property(name, value)
    return m


@contextmanager
def _producer(ns: str, group: str, timeout_ms: int = 5000) -> Iterator[Producer]:
    p = Producer(group, timeout=timeout_ms)
    p.set_namesrv_addr(ns)
    p.start()
    try:
        yield p
    finally:
        p.shutdown()


def _result(r) -> dict:
    return {"status": int(r.status), "msgId": r.msg_id, "offset": r.offset}


def send(ns: str, spec: dict) -> list[dict]:
    with _producer(ns, spec.get("group", "PG_CPP"), spec.get("timeoutMs", 5000)) as p:
        mode, n = spec.get("mode", "sync"), spec["n"]
        if mode == "batch":
            return [_result(p.send_batch([_build(spec, i) for i in range(n)]))]
        if mode == "async":
            return _send_async(p, spec)
        out = []
        for i in range(n):
            m = _build(spec, i)
            if mode == "oneway":
                p.send_oneway(m)
            else:
                out.append(_result(p.send_orderly(m, spec.get("arg", 0)) if mode == "orderly" else p.send_sync(m)))
        return out


def _send_async(p: Producer, spec: dict) -> list[dict]:
    """All n in flight at once; the results in completion order."""
    out: list[dict] = []
    done = threading.Event()

    def finish(entry: dict) -> None:
        out.append(entry)
        if len(out) == spec["n"]:
            done.set()
    messages = [_build(spec, i) for i in range(spec["n"])]
    for m in messages:
        p.send_async(m, lambda r: finish(_result(r)), lambda e: finish({"error": str(e)}))
    if not done.wait(spec.get("timeoutS", 20)):
        raise TimeoutError(f"{len(out)} of {spec['n']} async sends completed")
    return out


def push(ns: str, spec: dict) -> list[dict]:
    model = MessageModel[spec.get("model", "CLUSTERING")]
    c = PushConsumer(spec["group"], orderly=spec.get("orderly", False), message_model=model)
    c.set_namesrv_addr(ns)
    got: list[dict] = []
    lock, enough, primed, beyond = threading.Lock(), threading.Event(), threading.Event(), threading.Event()
    failures = [spec.get("failFirst", 0)]

    def on_message(m) -> None:
        if m.tags == b"Probe":
            primed.set()
            return
        with lock:
            if failures[0] > 0:
                failures[0] -= 1
                raise RuntimeError("failing on purpose: RECONSUME_LATER")
            got.append(_message(m))
            if len(got) >= spec["expect"]:
                enough.set()
            if len(got) > spec["expect"]:
                beyond.set()

    c.subscribe(spec["topic"], on_message, spec.get("expression", "*"))
    c.start()
    try:
        later = spec.get("sendAfterStart")
        if later is not None:
            _prime(ns, spec["topic"], primed, spec.get("timeoutS", 30))
            send(ns, later)
        enough.wait(spec.get("timeoutS", 30))
        # anything beyond `expect` (a duplicate) shows up too: up to settleS more for a first one
        beyond.wait(spec.get("settleS", 0))
        with lock:
            return list(got)
    finally:
        c.shutdown()


def _prime(ns: str, topic: str, primed: threading.Event, timeout: float) -> None:
    with _producer(ns, "PG_CPP_PROBE") as p:
        deadline = time.monotonic() + timeout
        while not primed.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no probe came back within {timeout}s: the consumer never pulled")
            m = Message(topic)
            m.set_tags("Probe")
            m.set_body("probe")
            p.send_sync(m)
            primed.wait(0.2)


def pull(ns: str, spec: dict) -> list[dict]:
    c = PullConsumer(spec["group"])
    c.set_namesrv_addr(ns)
    c.start()
    try:
        return [_message(m) for m in c.pull(spec["topic"], spec.get("expression", "*"))]
    finally:
        c.shutdown()


def send_for(ns: str, spec: dict) -> list[dict]:
    out: list[dict] = []
    with _producer(ns, spec.get("group", "PG_CPP"), spec.get("timeoutMs", 3000)) as p:
        end = time.monotonic() + spec["seconds"]
        i = 0
        while time.monotonic() < end:
            at = time.time()
            try:
                out.append({"at": at, **_result(p.send_sync(_build(spec, i)))})
            except Exception as exc:                # MQClientException: the send failed after its retries
                out.append({"at": at, "error": str(exc)[:200]})
            i += 1
            time.sleep(spec.get("intervalMs", 50) / 1000)
    return out


OPS = {"send": send, "push": push, "pull": pull, "sendFor": send_for}


def main() -> None:
    spec = json.loads(sys.argv[1])
    results = []
    for op in spec["ops"]:
        try:
            results.append({"ok": True, "value": OPS[op["op"]](spec["nameSrv"], op)})
        except Exception as exc:                    # the C++ client's MQClientException and ours
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}",
                            "trace": traceback.format_exc(limit=3)})
    print(json.dumps({"results": results}), flush=True)


if __name__ == "__main__":
    main()
