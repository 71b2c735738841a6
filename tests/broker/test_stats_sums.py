"""The stats items' sums on a real node (VIEW_BROKER_STATS_DATA, `smartgo admin stats-all`): sends and
pulls are in the day's and the hour's sums within one sample interval of being counted, and those sums
never go down while the minute list rolls over (the minute list samples every second here, so it
rolls over every 6 s; the hour and day lists keep their 10 min and 1 h)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from tests.support.nodes import ROOT
from tests.support.broker import pull_command, send_command, update_offset_command
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(120)
NODE_SETTINGS = {"stats_sample_interval": 1}
COUNTED = 15.0             # s for a count to reach the items: a 1 s flush, a 1 s sample, a loaded host
ROLLED = 40.0              # s for the minute list (6 s) to roll past the counts, generously


def stats(broker, name: str, key: str) -> dict | None:
    r = broker.call(RemotingCommand(RequestCode.VIEW_BROKER_STATS_DATA, ext_fields={"statsName": name,
                                                                                    "statsKey": key}))
    return json.loads(r.body_bytes()) if r.code == ResponseCode.SUCCESS else None


def sums(broker, items: dict[tuple[str, str], int]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(day, hour, minute) sums of each item (zeros for one the broker has not counted yet)."""
    found = {item: stats(broker, *item) for item in items}
    return {item: (s["statsDay"]["sum"], s["statsHour"]["sum"], s["statsMinute"]["sum"]) if s else (0, 0, 0)
            for item, s in found.items()}


def counted_then_kept(broker, items: dict[tuple[str, str], int]) -> None:
    """Wait until the day's sum of every item is its count; then poll until each minute sum has rolled
    back to 0, checking at every poll that the day's and the hour's sums still hold every count."""
    deadline = time.monotonic() + COUNTED
    polls = [sums(broker, items)]
    while not all(polls[-1][i][0] == n for i, n in items.items()):
        assert time.monotonic() < deadline, f"(day, hour, minute) sums {polls[-1]}, not {items}, after {COUNTED} s"
        time.sleep(0.1)
        polls = [sums(broker, items)]
    deadline = time.monotonic() + ROLLED
    while True:
        assert all(day == hour == items[i] for i, (day, hour, _) in polls[-1].items()), polls
        if not any(minute for _, _, minute in polls[-1].values()):
            break
        assert time.monotonic() < deadline, f"the minute sums never rolled over: {polls[-3:]}"
        time.sleep(0.25)
        polls.append(sums(broker, items))
    assert len(polls) > 1, "the counts never showed in the minute sums"    # so a roll-over was crossed


def test_day_and_hour_sums_hold_every_count_across_minute_roll_overs(broker):
    topic, groups = f"Orders_{uuid.uuid4().hex[:8]}", [f"g{i}_{uuid.uuid4().hex[:6]}" for i in (2, 3)]
    for i in range(5):
        assert broker.call(send_command(topic, b"order %d" % i, queue_id=0)).code == ResponseCode.SUCCESS
    max_offset = RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": topic, "queueId": "0"})
    wait_until(lambda: broker.call(max_offset).ext_fields.get("offset") == "5", message="five dispatched")
    for g in groups:
        p = broker.call(pull_command(topic, 0, 0, group=g))
        assert p.code == ResponseCode.SUCCESS and int(p.ext_fields["nextBeginOffset"]) == 5
        assert broker.call(update_offset_command(g, topic, 0, 5)).code == ResponseCode.SUCCESS
    items = {("TOPIC_PUT_NUMS", topic): 5, **{("GROUP_GET_NUMS", f"{topic}@{g}"): 5 for g in groups}}
    counted_then_kept(broker, items)

    for i in range(3):
        assert broker.call(send_command(topic, b"more %d" % i, queue_id=0)).code == ResponseCode.SUCCESS
    items[("TOPIC_PUT_NUMS", topic)] = 8
    counted_then_kept(broker, items)
    put = stats(broker, "TOPIC_PUT_NUMS", topic)
    for window in ("statsDay", "statsHour"):           # 8 requests of one message, at some rate above 0
        assert put[window]["avgpt"] == 1.0 and put[window]["tps"] > 0, put

    out = subprocess.run([sys.executable, "-m", "smartgo.cli", "admin", "stats-all", "--registry", broker.registry,
                          "--topic", topic, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout.strip().splitlines()[-1])["traffic"]
    assert {r["group"]: r["day_sum"] for r in rows} == {None: 8, **dict.fromkeys(groups, 5)}
