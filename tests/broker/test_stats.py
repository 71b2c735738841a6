"""The statistics files of a real broker (1-second windows): every record parses as docs/STATS.md
says, and the records add up to exactly what was sent and pulled."""

from __future__ import annotations

import json

from tests.support.broker import batch_command, pull_command, send_command, stats_records, update_offset_command
from smartgo.net.codes import ResponseCode
from smartgo.stats_schema import LATENCY_BOUNDS, SCHEMA_VERSION, file_name
from smartgo.store.record import decode_records
from tests.support.waits import wait_until

NODE_SETTINGS = {"stats_interval": 1}


def records(store) -> list[dict]:
    for path in (store / "stats").glob("*.jsonl"):
        assert all(file_name(json.loads(line)["ts"]) == path.name for line in path.read_text().splitlines())
    return stats_records(store)


def sums(recs: list[dict]) -> tuple[dict, dict, dict]:
    puts: dict[str, list[int]] = {}
    gets: dict[tuple[str, str], list[int]] = {}
    latency = {"send": 0, "pull": 0}
    for r in recs:
        for t in r["topics"]:
            c = puts.setdefault(t["topic"], [0, 0])
            c[0] += t["put_msgs"]
            c[1] += t["put_bytes"]
        for g in r["groups"]:
            c = gets.setdefault((g["group"], g["topic"]), [0, 0])
            c[0] += g["get_msgs"]
            c[1] += g["get_bytes"]
        for kind in latency:
            latency[kind] += r["latency"][kind]["count"]
    return puts, gets, latency


def test_stats_records_add_up_to_what_was_sent_and_pulled(broker):
    store = broker.node.store
    for i in range(20):
        r = broker.call(send_command("StatsA", b"a" * (i + 1), queue_id=i % 2))
        assert r.code == ResponseCode.SUCCESS
    r = broker.call(batch_command("StatsB", [(b"b" * 10, "") for _ in range(5)]))
    assert r.code == ResponseCode.SUCCESS
    pulled, pulled_bytes, pulls = 0, 0, 0
    for q in (0, 1):
        offset = 0
        while offset < 10:
            p = wait_until(lambda: (x := broker.call(pull_command("StatsA", q, offset, max_nums=4, group="SG"))).code
                           == ResponseCode.SUCCESS and x, message="dispatched")
            pulls += 1
            msgs = decode_records(p.body_bytes())
            pulled += len(msgs)
            pulled_bytes += len(p.body_bytes())
            offset = int(p.ext_fields["nextBeginOffset"])
    assert pulled == 20
    assert broker.call(update_offset_command("SG", "StatsA", 0, 4)).code == 0

    def complete():
        recs = records(store)
        puts, gets, _ = sums(recs)
        return puts.get("StatsA", [0])[0] == 20 and puts.get("StatsB", [0])[0] == 5 and \
            gets.get(("SG", "StatsA"), [0])[0] == 20 and any(r["lag"] for r in recs) and recs
    wait_until(complete, timeout=15, interval=0.2, message="the stats records of the traffic")
    # the broker's own records (an offset-moved event here) are not counted as puts, as in 4.x
    assert broker.call(pull_command("StatsA", 0, 99, group="SG")).code == ResponseCode.PULL_OFFSET_MOVED
    event = wait_until(lambda: (x := broker.call(pull_command("OFFSET_MOVED_EVENT", 0, 0, group="SG2"))).code
                       == ResponseCode.SUCCESS and decode_records(x.body_bytes())[-1], message="the event")
    recs = wait_until(lambda: (rs := records(store)) and max(r["ts"] for r in rs) > event.store_timestamp + 1000 and rs,
                      timeout=15, interval=0.2, message="a stats window after the event")
    puts, gets, latency = sums(recs)
    assert "OFFSET_MOVED_EVENT" not in puts and puts["StatsA"][0] == 20
    assert gets[("SG", "StatsA")] == [20, pulled_bytes]
    assert puts["StatsB"][0] == 5 and puts["StatsA"][1] > sum(range(1, 21))    # whole records, not just bodies
    assert latency["send"] >= 21 and latency["pull"] >= pulls
    for r in recs:
        assert r["v"] == SCHEMA_VERSION and r["window_s"] == 1 and r["ts"] % 1000 == 0
        assert r["broker"] == "broker-a" and r["addr"] == broker.addr and r["broker_id"] == 0
        assert r["totals"]["put_msgs"] == sum(t["put_msgs"] for t in r["topics"])
        assert r["totals"]["get_msgs"] == sum(g["get_msgs"] for g in r["groups"])
        for kind in ("send", "pull"):
            h = r["latency"][kind]
            assert [b for b, _ in h["buckets"]] == list(LATENCY_BOUNDS)
            assert sum(n for _, n in h["buckets"]) == h["count"]
            assert h["count"] == 0 or 0 < h["p50_ms"] <= h["p90_ms"] <= h["p99_ms"] <= h["max_ms"]
    assert len({r["ts"] for r in recs}) == len(recs)                         # one record per window
    lag = next(r for r in reversed(recs) if r["lag"])["lag"]
    assert {"group": "SG", "topic": "StatsA", "queue_id": 0, "broker_offset": 10, "consumer_offset": 4,
            "lag": 6} in lag
