"""ali-ons against SmartGo, data path: topic creation, sends, pulls, offsets, long polling, and the
messages crossing between ali-ons and SmartGo's Python client in both directions.

These need only the data path (310, 11, 17, 29, 30, 105, and 12/33 through the Python admin) and,
for test_delay_level, the delay (schedule) service. The push consumer, which needs the control
plane, is in test_ali_ons_consumer.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import time
import zlib

import pytest

from smartgo.client import AsyncAdmin
from smartgo.net.codes import RequestCode
from tests.support.waits import wait_until

from .conftest import NODE_DIR, OnsError, arun, create_topic, ons, python_read, python_send, topic_name

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("ali_ons")]

HEX = set("0123456789ABCDEF")


def test_create_topic_and_route(cluster):
    topic = topic_name("ONS_ROUTE")
    route = create_topic(cluster, topic, queues=3)
    # ali-ons parsed the registry's route JSON and finds the master at brokerAddrs["0"]
    (broker,) = route["brokerDatas"]
    assert broker["brokerAddrs"] == {"0": cluster.broker}
    (queue,) = route["queueDatas"]
    assert (queue["readQueueNums"], queue["writeQueueNums"], queue["perm"]) == (3, 3, 6)
    assert queue["brokerName"] == broker["brokerName"]

    async def python_route():
        async with AsyncAdmin(cluster.registry) as admin:
            return await admin.topic_route(topic)
    r = arun(python_route())
    assert r.broker_datas[0].master_addr == cluster.broker
    assert [(q.read_queue_nums, q.write_queue_nums) for q in r.queue_datas] == [(3, 3)]


def test_send_to_unknown_topic_fails_clearly(cluster):
    """ali-ons asks the registry for the route and gives up on TOPIC_NOT_EXIST (it does not use
    TBW102 auto-creation): a clear MQClientException, as against Apache RocketMQ."""
    with pytest.raises(OnsError, match="No topic route info in name server for the topic"):
        ons("producer", {"nameSrv": cluster.registry, "group": "PG_ONS_UNKNOWN",
                         "messages": [{"topic": topic_name("ONS_NOPE"), "body": "x"}]})


def test_ali_ons_sends_and_python_reads(cluster):
    topic = topic_name("ONS_SEND")
    create_topic(cluster, topic)
    bodies = [os.urandom(37) + bytes([0, 1, 2, 255]) + f"#{i}".encode() for i in range(12)]
    messages = [{"topic": topic, "tags": "TagA" if i % 2 == 0 else "TagB", "keys": [f"ons-{i}", f"order-{i % 3}"],
                 "bodyB64": base64.b64encode(b).decode(), "flag": i, "properties": {"color": "red", "n": str(i),
                                                                                   "utf8": "zhōng 中"}}
                for i, b in enumerate(bodies)]
    out = ons("producer", {"nameSrv": cluster.registry, "group": "PG_ONS_SEND", "credentials": True,
                           "messages": messages, "close": False})
    results = out["results"]
    assert [r["sendStatus"] for r in results] == ["SEND_OK"] * 12
    assert len({(r["queueId"], r["queueOffset"]) for r in results}) == 12
    for r in results:
        assert len(r["msgId"]) == 32 and set(r["msgId"]) <= HEX       # offsetMsgId: IPv4 host + port + offset
    # every send went out as SEND_MESSAGE_V2 with raw JS numbers and booleans plus the ONS
    # credential fields in extFields: the broker accepted all of them
    sends = [c for c in out["calls"] if c["code"] == RequestCode.SEND_MESSAGE_V2]
    assert len(sends) == 12 and all(c["resp"] == 0 for c in sends)
    assert all(isinstance(c["ext"]["e"], int) and isinstance(c["ext"]["g"], int) and c["ext"]["k"] is False
               and "Signature" in c["ext"] and "AccessKey" in c["ext"] for c in sends)

    got = python_read(cluster, topic)
    assert len(got) == 12
    by_id = {m.msg_id: m for m in got}
    assert set(by_id) == {r["msgId"] for r in results}      # the broker's offsetMsgId, as ali-ons reported it
    for i, r in enumerate(results):
        m = by_id[r["msgId"]]
        assert m.body == bodies[i]
        assert m.tags == messages[i]["tags"]
        assert m.keys == [f"ons-{i}", f"order-{i % 3}"]
        assert (m.properties["color"], m.properties["n"], m.properties["utf8"]) == ("red", str(i), "zhōng 中")
        assert m.flag == i
        assert (m.queue_id, m.queue_offset) == (r["queueId"], r["queueOffset"])
        # ali-ons builds no UNIQ_KEY: its message id is the broker's offsetMsgId
        assert m.uniq_key is None and "" not in m.properties
    tag_a = python_read(cluster, topic, "TagA")
    assert sorted(m.msg_id for m in tag_a) == sorted(r["msgId"] for r in results[::2])


def test_ali_ons_keys_are_indexed(cluster):
    topic = topic_name("ONS_KEYS")
    create_topic(cluster, topic, queues=2)
    out = ons("producer", {"nameSrv": cluster.registry, "group": "PG_ONS_KEYS", "close": False, "messages": [
        {"topic": topic, "tags": "K", "keys": ["invoice-17", "user-9"], "body": "indexed"}]})
    (sent,) = out["results"]

    async def main():
        async with AsyncAdmin(cluster.registry) as admin:
            deadline = time.monotonic() + 10
            while not (found := await admin.query_by_key(topic, "user-9")) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)          # the dispatch actor indexes keys asynchronously
            return found, await admin.view_message(sent["msgId"])
    found, viewed = arun(main())
    assert [m.body for m in found] == [b"indexed"] and found[0].msg_id == sent["msgId"]
    assert viewed.body == b"indexed" and viewed.keys == ["invoice-17", "user-9"]


def test_compressed_body_round_trip(cluster):
    """ali-ons deflates bodies of 4 KiB and more (zlib, COMPRESSED_FLAG); both clients read the
    original bytes back, and the stored CRC is over the compressed bytes."""
    topic = topic_name("ONS_ZIP")
    create_topic(cluster, topic, queues=1)
    big = (b"SmartGo compat " * 700) + os.urandom(64)        # ~10 KiB, compressible
    out = ons("producer", {"nameSrv": cluster.registry, "group": "PG_ONS_ZIP", "close": False, "messages": [
        {"topic": topic, "tags": "Z", "bodyB64": base64.b64encode(big).decode()}]})
    (sent,) = out["results"]
    wire = base64.b64decode(sent["sentBody"])
    assert len(wire) < len(big) and zlib.decompress(wire) == big

    (m,) = python_read(cluster, topic)
    assert m.body == big and m.store_size < len(big)        # stored compressed, inflated by the client
    pulled = ons("api", {"nameSrv": cluster.registry, "ops": [
        {"op": "pull", "broker": cluster.broker, "group": "CG_ONS_ZIP", "topic": topic, "queueId": 0, "offset": 0}]})
    (msg,) = pulled["results"][0]["value"]["messages"]
    assert base64.b64decode(msg["body"]) == big
    assert msg["sysFlag"] & 0x1 and msg["bodyCRC"] == zlib.crc32(wire) & 0x7FFFFFFF


def test_ali_ons_pulls_python_messages(cluster):
    """ali-ons' pull request (the one its push consumer sends, here at exact offsets): server-side
    tag filtering, bodies, properties, ids, and pulls of old and impossible offsets."""
    topic = topic_name("ONS_PULL")
    create_topic(cluster, topic, queues=2)
    sent = python_send(cluster, topic, 30, big_every=10)
    ops = [{"op": "pull", "broker": cluster.broker, "group": "CG_ONS_PULL", "topic": topic, "queueId": q,
            "offset": 0, "expression": "A || C"} for q in (0, 1)]
    ops += [{"op": "maxOffset", "broker": cluster.broker, "topic": topic, "queueId": q} for q in (0, 1)]
    out = ons("api", {"nameSrv": cluster.registry, "ops": ops})
    assert all(r["ok"] for r in out["results"]), out["results"]
    pulls, maxes = out["results"][:2], [r["value"] for r in out["results"][2:]]
    got = [m for p in pulls for m in p["value"]["messages"]]
    wanted = {r.offset_msg_id: (msg, r) for msg, r in sent if msg.tags in ("A", "C")}
    assert sorted(m["msgId"] for m in got) == sorted(wanted)
    for m in got:
        msg, r = wanted[m["msgId"]]
        assert base64.b64decode(m["body"]) == msg.body
        assert m["tags"] == msg.tags and m["keys"] == msg.keys[0]
        assert m["properties"]["UNIQ_KEY"] == r.msg_id and m["properties"]["idx"] == msg.properties["idx"]
        assert (m["queueId"], m["queueOffset"]) == (r.queue.queue_id, r.queue_offset)
        assert m["storeHost"] == cluster.broker and m["bornHost"].startswith("127.0.0.1:")
    for q, p in enumerate(pulls):
        v = p["value"]
        assert v["pullStatus"] == "FOUND" and v["minOffset"] == 0 and v["maxOffset"] == maxes[q]
        assert v["nextBeginOffset"] == maxes[q] and v["suggestWhichBrokerId"] == "0"
        assert all("MIN_OFFSET" in m["properties"] for m in v["messages"])
    assert sum(maxes) == 30

    # an old offset, the end of the queue, and an offset far past it
    q0 = maxes[0]
    out = ons("api", {"nameSrv": cluster.registry, "ops": [
        {"op": "pull", "broker": cluster.broker, "group": "CG_ONS_PULL", "topic": topic, "queueId": 0,
         "offset": q0 - 2, "maxNums": 1},
        {"op": "pull", "broker": cluster.broker, "group": "CG_ONS_PULL", "topic": topic, "queueId": 0, "offset": q0},
        {"op": "pull", "broker": cluster.broker, "group": "CG_ONS_PULL", "topic": topic, "queueId": 0,
         "offset": q0 + 1000}]})
    old, end, far = (r["value"] for r in out["results"])
    assert [m["queueOffset"] for m in old["messages"]] == [q0 - 2] and old["nextBeginOffset"] == q0 - 1
    assert (end["pullStatus"], end["nextBeginOffset"]) == ("NO_NEW_MSG", q0)
    assert far["pullStatus"] == "OFFSET_ILLEGAL" and far["nextBeginOffset"] == q0


def test_offsets_by_timestamp(cluster):
    topic = topic_name("ONS_TIME")
    create_topic(cluster, topic, queues=1)
    first = python_send(cluster, topic, 3)
    wait_ms = int(time.time() * 1000) + 20
    while int(time.time() * 1000) <= wait_ms:        # a store timestamp strictly after the first three
        time.sleep(0.005)
    second = python_send(cluster, topic, 2)
    out = ons("api", {"nameSrv": cluster.registry, "ops": [
        {"op": "searchOffset", "broker": cluster.broker, "topic": topic, "queueId": 0, "timestamp": 0},
        {"op": "searchOffset", "broker": cluster.broker, "topic": topic, "queueId": 0, "timestamp": wait_ms},
        {"op": "maxOffset", "broker": cluster.broker, "topic": topic, "queueId": 0}]})
    assert [r["value"] for r in out["results"]] == [0, 3, 5]
    assert [r.queue_offset for _, r in first + second] == [0, 1, 2, 3, 4]


def test_long_polling_wakes_ali_ons_pull(cluster):
    """A suspended ali-ons pull at the end of a queue is answered when a message arrives, not at
    its 20 s deadline."""
    topic = topic_name("ONS_HOLD")
    create_topic(cluster, topic, queues=1)
    spec = {"nameSrv": cluster.registry, "ops": [
        {"op": "route", "topic": topic},
        {"op": "pull", "broker": cluster.broker, "group": "CG_ONS_HOLD", "topic": topic, "queueId": 0, "offset": 0,
         "suspendMs": 20000, "announce": True}]}
    proc = subprocess.Popen(["node", "api.js", json.dumps(spec)], cwd=NODE_DIR, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:                  # wait until the pull request is on its way
            if line.strip() == "op pull":
                break
        started = time.monotonic()
        ((msg, r),) = python_send(cluster, topic, 1)
        stdout, stderr = proc.communicate(timeout=30)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = json.loads(stdout.strip().splitlines()[-1])
    pulled = result["results"][1]
    assert pulled["ok"], (pulled, stderr)
    assert pulled["value"]["pullStatus"] == "FOUND"
    assert [m["properties"]["UNIQ_KEY"] for m in pulled["value"]["messages"]] == [r.msg_id]
    assert elapsed < 15, f"the parked pull was answered after {elapsed:.1f}s, not on arrival"
    (call,) = [c for c in result["calls"] if c["code"] == RequestCode.PULL_MESSAGE]
    assert call["ext"]["sysFlag"] == 6 and call["ext"]["suspendTimeoutMillis"] == 20000   # SUSPEND | SUBSCRIPTION


def test_delay_level(cluster):
    """DELAY=1 (ali-ons' delayTimeLevel): stored in SCHEDULE_TOPIC_XXXX and delivered to the topic
    a second later (the delay service)."""
    topic = topic_name("ONS_DELAY")
    create_topic(cluster, topic, queues=1)
    out = ons("producer", {"nameSrv": cluster.registry, "group": "PG_ONS_DELAY", "close": False, "messages": [
        {"topic": topic, "tags": "D", "keys": ["later"], "body": "one second later", "properties": {"DELAY": "1"}}]})
    assert out["results"][0]["sendStatus"] == "SEND_OK"
    (m,) = wait_until(lambda: python_read(cluster, topic), timeout=15, interval=0.2,
                      message="the delayed message in its topic")
    assert m.body == b"one second later" and m.keys == ["later"] and m.tags == "D"
    assert m.properties.get("REAL_TOPIC") == topic and m.properties.get("REAL_QID") == "0"
    assert "DELAY" not in m.properties
    assert m.store_timestamp - m.born_timestamp >= 900, "delivered without its delay"


def test_start_deliver_time_and_5x_timer_properties(cluster):
    """setStartDeliverTime (__STARTDELIVERTIME, Aliyun's timed delivery) and 5.x's TIMER_DELAY_SEC
    from ali-ons: each stored at its time, not before, in its topic."""
    topic = topic_name("ONS_TIMER")
    create_topic(cluster, topic, queues=1)
    at = int(time.time() * 1000) + 1500
    out = ons("producer", {"nameSrv": cluster.registry, "group": "PG_ONS_TIMER", "close": False, "messages": [
        {"topic": topic, "tags": "T", "body": "at a time", "properties": {"__STARTDELIVERTIME": str(at)}},
        {"topic": topic, "tags": "T", "body": "a second on", "properties": {"TIMER_DELAY_SEC": "1"}}]})
    assert [r["sendStatus"] for r in out["results"]] == ["SEND_OK", "SEND_OK"]
    got = wait_until(lambda: (m := python_read(cluster, topic)) and len(m) == 2 and m, timeout=15, interval=0.2,
                     message="both timer messages in their topic")
    by_body = {m.body: m for m in got}
    assert by_body[b"at a time"].store_timestamp >= at
    second = by_body[b"a second on"]
    assert second.store_timestamp >= int(second.properties["TIMER_OUT_MS"]) >= second.born_timestamp + 1000
    assert all(m.tags == "T" and m.properties["REAL_TOPIC"] == topic and "DELAY" not in m.properties for m in got)
