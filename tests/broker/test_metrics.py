"""The Prometheus endpoint (metrics_port): the exposition text, the HTTP server's answers to good
and bad requests, and a real node's page after known traffic - 5.x's names and labels, counts
that add up to what was sent and pulled, lag from committed offsets, connections by language,
and every actor up."""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import urllib.request
from types import SimpleNamespace

import pytest

from smartgo.broker.actors.broker_actor import BrokerActor
from smartgo.broker.stats.metrics import BrokerMetrics
from smartgo.broker.stats.metrics_http import MAX_HEAD, BadRequest, MetricsServer, Request, answer, parse_head
from smartgo.broker.stats.prometheus import CONTENT_TYPE, Family, render
from smartgo.broker.stats.stats import LatencyHistogram, NetStats, StatsBook, transaction_counts
from tests.support.broker import (FREE_PORT, ClientStub, metric_value, parse_metrics, pull_command, scrape_metrics,
                                    send_command, stats_records, update_offset_command)
from smartgo.config import NodeConfig
from smartgo.net.codes import LanguageCode, MQVersion, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import decode_records, parse_offset_msg_id
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(60)

NODE_SETTINGS = {"metrics_port": FREE_PORT, "metrics_host": "127.0.0.1", "stats_sample_interval": 1,
                 "stats_interval": 1}
TOPIC = "TopicMetrics"
IDLE_TOPIC = "TopicMetricsIdle"
GROUP = "CG_METRICS"
RETRY = "%RETRY%" + GROUP               # a Java consumer's heartbeat lists its retry topic
# ---- the exposition format --------------------------------------------------------------------------------
def test_render_escapes_label_values_and_writes_cumulative_histograms():
    const = {"cluster": "C", "node_type": "broker", "node_id": "b"}
    counter = Family("rocketmq_messages_in_total", "counter", "Messages\nstored \\ by topic", const)
    counter.add({"topic": 'a"b\\c\nd'}, 3)
    empty = Family("rocketmq_unused", "gauge", "never written", const)
    hist = Family("smartgo_request_latency_milliseconds", "histogram", "latency", const)
    hist.add_histogram({"request": "send"}, [1.0, 5.0], [2, 0, 1], 7.5)
    text = render([counter, empty, hist]).decode()
    assert "# HELP rocketmq_messages_in_total Messages\\nstored \\\\ by topic\n" in text
    assert "rocketmq_unused" not in text
    samples = parse_metrics(text)
    assert metric_value(samples, "rocketmq_messages_in_total", topic='a"b\\c\nd', cluster="C") == 3
    line = next(x for x in text.splitlines() if x.startswith("rocketmq_messages_in_total"))
    assert line.startswith('rocketmq_messages_in_total{cluster="C",node_type="broker",node_id="b",topic=')
    buckets = [metric_value(samples, "smartgo_request_latency_milliseconds_bucket", le=le)
               for le in ("1.0", "5.0", "+Inf")]
    assert buckets == [2, 2, 3]
    assert metric_value(samples, "smartgo_request_latency_milliseconds_sum") == 7.5
    assert metric_value(samples, "smartgo_request_latency_milliseconds_count") == 3


def test_latency_histograms_carry_their_sum_through_the_wire():
    h = LatencyHistogram()
    for ms in (0.2, 3.0, 9000.0):
        h.observe(ms)
    merged = LatencyHistogram()
    merged.add_wire(h.to_wire())
    merged.add_wire(h.to_wire())
    assert (merged.count, merged.sum_ms, merged.max_ms) == (6, pytest.approx(2 * 9003.2), 9000.0)
    assert merged.buckets[-1] == 2                      # above the last bound: +Inf only


def test_transaction_counts_carry_through_the_wire_into_5x_buckets():
    net = NetStats()
    for commit, seconds in ((True, 3), (False, 5), (True, 90_000)):   # 5 s is in the 5 s bucket; over a day: +Inf
        net.ended("T", commit, seconds)
    wire = net.take()
    assert net.take() is None                            # taken: nothing left until the next transaction
    book = StatsBook(60, 0)
    book.add(1000, wire)
    book.add(2000, wire)
    assert transaction_counts(book.transactions["T"]) == (4, 2, [4, 0, 0, 0, 0, 0, 2], 2 * 90_008)


def test_a_send_request_is_one_size_observation_of_its_average_record():
    net = NetStats()
    net.stored("T", 1, 1024)                             # 1 KiB is in the 1 KiB bucket
    net.stored("T", 32, 32 * 5000)                       # a batch: one observation of 5,000 bytes
    net.stored("T", 1, 5 * 1024 * 1024)                  # over 4 MiB: +Inf
    book = StatsBook(60, 0)
    book.add(1000, net.take())
    assert book.sizes["T"] == [1, 0, 1, 0, 0, 0, 1, 1024 + 5000 + 5 * 1024 * 1024]


def test_group_labels_mark_retry_topics_and_system_groups():
    metrics = BrokerMetrics(SimpleNamespace(config=NodeConfig()))   # type: ignore[arg-type]
    assert metrics._group_labels("%RETRY%CG", "CG") == {"topic": "%RETRY%CG", "consumer_group": "CG",
                                                         "is_retry": "true", "is_system": "false"}
    assert metrics._group_labels("Orders", "CID_RMQ_SYS_TRANS")["is_system"] == "true"
    assert metrics._group_labels("TBW102", "CG")["is_system"] == "true"
    assert metrics._group_labels("Orders", "CG")["is_system"] == "false"


# ---- the HTTP side, without a broker ---------------------------------------------------------------------
def test_request_heads_are_parsed_or_refused():
    assert parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n") == Request("GET", "/metrics")
    for bad in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"GET /metrics\r\n\r\n",
                b"GET /metrics SPDY/3\r\n\r\n", b"GET /m\xe9trics HTTP/1.1\r\n\r\n", b"G\x00T / HTTP/1.1\r\n\r\n"):
        with pytest.raises(BadRequest):
            parse_head(bad)
    page = lambda: b"m 1\n"                      # noqa: E731
    assert answer(Request("GET", "/"), page).startswith(b"HTTP/1.1 404 Not Found\r\n")
    post = answer(Request("POST", "/metrics"), page)
    assert post.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD\r\n" in post
    ok = answer(Request("GET", "/metrics"), page)
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n") and ok.endswith(b"\r\n\r\nm 1\n")
    assert f"Content-Type: {CONTENT_TYPE}\r\n".encode() in ok and b"Content-Length: 4\r\n" in ok
    head = answer(Request("HEAD", "/metrics"), page)
    assert head.endswith(b"\r\n\r\n") and b"Content-Length: 4\r\n" in head
    assert b"Content-Encoding" not in ok


def test_a_scraper_that_accepts_gzip_gets_the_page_gzipped():
    accepts = b"GET /metrics HTTP/1.1\r\nHost: a\r\nAccept-Encoding: %s\r\n\r\n"
    for value, gzipped in ((b"gzip", True), (b"deflate, GZIP;q=0.5", True), (b"*", True), (b"gzip;q=0", False),
                           (b"identity, *;q=0", False), (b"deflate", False), (b"gzip;q=x", False)):
        assert parse_head(accepts % value) == Request("GET", "/metrics", gzipped), value
    assert parse_head(b"GET /metrics HTTP/1.1\r\naccept-encoding:gzip\r\n\r\n").gzip
    page = b"m 1\n" * 1000
    ok = answer(Request("GET", "/metrics", gzip=True), lambda: page)
    head, body = ok.split(b"\r\n\r\n", 1)
    assert b"\r\nContent-Encoding: gzip\r\n" in head and f"Content-Length: {len(body)}\r\n".encode() in head
    assert gzip.decompress(body) == page and len(body) < len(page) // 20
    only_head = answer(Request("HEAD", "/metrics", gzip=True), lambda: page)
    assert only_head == head + b"\r\n\r\n"


def test_the_server_answers_bad_requests_and_goes_on_serving(caplog, monkeypatch):
    monkeypatch.setattr("smartgo.broker.stats.metrics_http.READ_TIMEOUT", 0.3)
    log = logging.getLogger("test.metrics")
    broken = {"on": False}

    def page() -> bytes:
        if broken["on"]:
            raise RuntimeError("boom")
        return b"m 1\n"

    async def exchange(port: int, data: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        await writer.drain()
        out = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return out

    async def main() -> list[bytes]:
        server = MetricsServer(page, log)
        await server.start("127.0.0.1", 0)
        good = b"GET /metrics HTTP/1.1\r\n\r\n"
        out = [await exchange(server.port, b"\x00\xff garbage\r\n\r\n"),
               await exchange(server.port, b"GET /" + b"a" * MAX_HEAD + b" HTTP/1.1\r\n\r\n"),
               await exchange(server.port, b"GET /metrics HTTP/1.1\r\n"),      # never finished
               await exchange(server.port, good)]
        broken["on"] = True
        out.append(await exchange(server.port, good))
        broken["on"] = False
        out.append(await exchange(server.port, good))
        await server.close()
        return out

    with caplog.at_level(logging.WARNING, logger="test.metrics"):
        garbage, huge, unfinished, good, failed, again = asyncio.run(main())
    assert garbage.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert huge.startswith(b"HTTP/1.1 431 ")
    assert unfinished == b""
    assert good.endswith(b"m 1\n") and again.endswith(b"m 1\n")
    assert failed.startswith(b"HTTP/1.1 500 ")
    text = caplog.text
    assert "bad request" in text and f"over {MAX_HEAD} bytes" in text and "no complete request head" in text
    assert "page could not be built" in text and "boom" in text


def test_a_taken_port_costs_the_metrics_not_the_broker(caplog):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    fake = SimpleNamespace(config=NodeConfig(), log=logging.getLogger("test.metrics.port"), metrics=None)
    with caplog.at_level(logging.ERROR, logger="test.metrics.port"):
        asyncio.run(BrokerActor._serve_metrics(fake, "127.0.0.1", taken.getsockname()[1]))  # type: ignore[arg-type]
    taken.close()
    assert fake.metrics is None
    assert "metrics endpoint not served: cannot listen on 127.0.0.1" in caplog.text


# ---- a real node -------------------------------------------------------------------------------------------
def scrape(broker, path: str = "/metrics") -> tuple[int, str, str]:
    return scrape_metrics(broker.node.metrics_port, path)


def test_a_node_reports_its_traffic_lag_clients_and_actors(broker):
    consumer = ClientStub(broker.addr, "10.0.0.9@consumer")
    producer = ClientStub(broker.addr, "10.0.0.8@producer")
    try:
        assert broker.call(send_command(IDLE_TOPIC, b"never consumed")).code == ResponseCode.SUCCESS
        assert consumer.heartbeat({GROUP: {TOPIC: "*", IDLE_TOPIC: "*", RETRY: "*"}}, language=LanguageCode.JAVA,
                                  client_version=MQVersion.V4_9_4).code == ResponseCode.SUCCESS
        assert producer.heartbeat(producers=("PG_METRICS",), language=LanguageCode.CPP).code == ResponseCode.SUCCESS
        for queue_id, n in ((1, 3), (0, 5)):     # queue 1 first: once queue 0 is dispatched, so is queue 1
            for i in range(n):
                r = broker.call(send_command(TOPIC, b"m" * 100, queue_id=queue_id))
                assert r.code == ResponseCode.SUCCESS, r.remark
        pulled = 0
        while pulled < 5:                   # dispatch may not have reached every send yet: pull on
            r = wait_until(lambda: (x := broker.call(pull_command(TOPIC, 0, pulled, group=GROUP))).code
                           == ResponseCode.SUCCESS and x, 10, 0.05, "a pull with messages")
            pulled += len(decode_records(r.body_bytes()))
        assert pulled == 5
        for group, queue_id, offset in ((GROUP, 0, 2), (GROUP, 1, 0), ("CG_OFFLINE", 0, 1)):
            assert broker.call(update_offset_command(group, TOPIC, queue_id, offset)).code == ResponseCode.SUCCESS

        def page():      # the net actor's stats reach the broker actor each second
            status, ctype, text = scrape(broker)
            samples = parse_metrics(text)
            done = metric_value(samples, "rocketmq_messages_in_total", topic=TOPIC) == 8 and \
                metric_value(samples, "rocketmq_messages_out_total", topic=TOPIC, consumer_group=GROUP) == 5
            return (status, ctype, samples) if done else None
        status, ctype, samples = wait_until(page, 20, 0.2, "the sends and the pull on the metrics page")

        assert (status, ctype) == (200, CONTENT_TYPE)
        const = {"cluster": "DefaultCluster", "node_type": "broker", "node_id": "broker-a"}
        assert metric_value(samples, "rocketmq_messages_in_total", topic=TOPIC, message_type="normal",
                            is_system="false", **const) == 8
        bytes_in = metric_value(samples, "rocketmq_throughput_in_total", topic=TOPIC)
        assert bytes_in >= 8 * 100
        # one observation per send request, its records' average size: 8 single sends under 1 KiB
        size = {"topic": TOPIC, "message_type": "normal", "is_system": "false"}
        assert metric_value(samples, "rocketmq_message_size_bucket", le="1024.0", **size) == 8
        assert metric_value(samples, "rocketmq_message_size_count", **size) == 8
        assert metric_value(samples, "rocketmq_message_size_sum", **size) == bytes_in
        out = {"topic": TOPIC, "consumer_group": GROUP, "is_retry": "false", "is_system": "false"}
        assert metric_value(samples, "rocketmq_throughput_out_total", **out) >= 5 * 100
        # committed 2 of queue 0's 5 and 0 of queue 1's 3
        assert metric_value(samples, "rocketmq_consumer_lag_messages", **out) == 6
        assert 0 < metric_value(samples, "rocketmq_consumer_lag_latency", **out) < 60_000
        # a group with no consumer online keeps its lag (queue 1, never committed, counts 0, as in 5.x)
        assert metric_value(samples, "rocketmq_consumer_lag_messages", topic=TOPIC, consumer_group="CG_OFFLINE") == 4
        # a subscribed topic with nothing committed is listed with 0
        assert metric_value(samples, "rocketmq_consumer_lag_messages", topic=IDLE_TOPIC, consumer_group=GROUP) == 0
        assert metric_value(samples, "rocketmq_consumer_lag_messages", topic=RETRY) is None   # 5.x skips it too
        assert metric_value(samples, "rocketmq_consumer_connections", consumer_group=GROUP, language="java",
                            version=str(int(MQVersion.V4_9_4)), consume_mode="push") == 1
        assert metric_value(samples, "rocketmq_producer_connections", language="cpp") == 1
        assert metric_value(samples, "smartgo_pulls_total", result="found") >= 1
        sends = metric_value(samples, "smartgo_request_latency_milliseconds_count", request="send")
        assert sends >= 8
        buckets = sorted((float(dict(ls)["le"]), v) for (n, ls), v in samples.items()
                         if n == "smartgo_request_latency_milliseconds_bucket" and ("request", "send") in ls)
        assert buckets[-1] == (float("inf"), sends)
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))
        assert metric_value(samples, "smartgo_request_latency_milliseconds_sum", request="send") > 0
        assert metric_value(samples, "rocketmq_broker_permission") == 6
        assert metric_value(samples, "rocketmq_topic_number") >= 1
        assert metric_value(samples, "smartgo_disk_full") == 0
        assert metric_value(samples, "rocketmq_storage_dispatch_behind_bytes", storage_type="local") >= 0
        assert metric_value(samples, "smartgo_commitlog_max_offset") >= 8 * 100
        assert 0 < metric_value(samples, "rocketmq_storage_message_reserve_time") < 600_000
        assert metric_value(samples, "smartgo_node_healthy") == 1
        for actor in ("net-0", "dispatch", "flush", "hold", "cleanup", "broker", "schedule"):
            assert metric_value(samples, "smartgo_actor_up", actor=actor) == 1, actor
            assert metric_value(samples, "smartgo_actor_restarts_total", actor=actor) == 0, actor
            assert metric_value(samples, "smartgo_process_resident_memory_bytes", actor=actor) > 1 << 20, actor
            assert metric_value(samples, "smartgo_process_cpu_seconds_total", actor=actor) is not None, actor
            assert 0 <= metric_value(samples, "smartgo_actor_loop_lag_seconds", actor=actor) < 5, actor
        assert metric_value(samples, "smartgo_process_cpu_seconds_total", actor="supervisor") is not None
        assert metric_value(samples, "smartgo_actor_progress_total", actor="net-0") >= sends  # each request counts
    finally:
        consumer.close()
        producer.close()


def test_a_node_refuses_bad_requests_and_keeps_serving(broker):
    status, _, text = scrape(broker, "/")
    assert status == 404 and "/metrics" in text
    with socket.create_connection(("127.0.0.1", broker.node.metrics_port), timeout=10) as s:
        s.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400 Bad Request")
    assert broker.call(send_command(TOPIC, b"after")).code == ResponseCode.SUCCESS
    status, _, text = scrape(broker)
    assert status == 200 and metric_value(parse_metrics(text), "smartgo_node_healthy") == 1
    broker.node.logged("metrics: bad request from")


def test_a_node_gzips_its_page_for_prometheus(broker):
    request = urllib.request.Request(f"http://127.0.0.1:{broker.node.metrics_port}/metrics", headers={
        "Accept-Encoding": "gzip", "User-Agent": "Prometheus/2.45.0"})
    with urllib.request.urlopen(request, timeout=10) as r:
        encoding, body = r.headers["Content-Encoding"], r.read()
    assert encoding == "gzip"
    samples = parse_metrics(gzip.decompress(body).decode())
    assert metric_value(samples, "smartgo_node_healthy") == 1


def test_messages_sent_to_the_dlq_are_counted_by_original_topic_and_group(broker):
    r = broker.call(send_command(TOPIC, b"poison"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    offset = parse_offset_msg_id(r.ext_fields["msgId"])[2]
    for delay_level, group in ((-1, "CG_DLQ"), (-1, "CG_DLQ"), (0, "CG_RETRY_ONLY")):   # -1: straight to the DLQ
        back = broker.call(RemotingCommand(RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields={
            "offset": str(offset), "group": group, "delayLevel": str(delay_level), "originMsgId": r.ext_fields["msgId"],
            "originTopic": TOPIC, "unitMode": "false"}))
        assert back.code == ResponseCode.SUCCESS, back.remark
    samples = parse_metrics(scrape(broker)[2])
    assert metric_value(samples, "rocketmq_send_to_dlq_messages_total", topic=TOPIC, consumer_group="CG_DLQ") == 2
    assert metric_value(samples, "rocketmq_send_to_dlq_messages_total", consumer_group="CG_RETRY_ONLY") is None

    def recorded() -> dict:                               # the stats files' dlq[] (docs/STATS.md)
        out: dict = {}
        for r in stats_records(broker.node.store):
            for d in r.get("dlq", ()):
                out[d["group"], d["topic"]] = out.get((d["group"], d["topic"]), 0) + d["msgs"]
        return out
    wait_until(lambda: recorded() == {("CG_DLQ", TOPIC): 2}, timeout=10, message="the DLQ sends in the stats records")
