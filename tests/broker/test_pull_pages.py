"""The net actor's memory while it serves a backlog: the CommitLog pages pulls touch leave its RSS
every RELEASE_EVERY bytes served (they stay in the page cache), so a consumer catching up does not
grow the actor by what it reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartgo.net.codes import ResponseCode
from tests.support.broker import batch_command, pull_command
from tests.support.waits import wait_until

BODY = b"p" * 4096
SERVED = 60 << 20                      # under the 64 MiB the net actor once served between releases
MAPPED_MAX = 24 << 20                  # RELEASE_EVERY (16 MiB), a pull's bytes, the writer's current file


def commitlog_rss(pid: int) -> int:
    """Bytes of the CommitLog files resident in the process's mappings (/proc/PID/smaps)."""
    total, in_commitlog = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:          # a mapping's header line
            in_commitlog = len(head) >= 6 and "/commitlog/" in head[5]
        elif in_commitlog and head[0] == "Rss:":
            total += int(head[1]) * 1024
    return total


@pytest.mark.timeout(120)
def test_a_net_actor_serving_a_backlog_keeps_few_commitlog_pages_mapped(start_node):
    broker = start_node({"topics": "Pages:1"})
    sent = 0
    while sent < SERVED:
        r = broker.call(batch_command("Pages", [(BODY, "")] * 32), timeout=30)
        assert r.code == ResponseCode.SUCCESS
        sent += 32 * len(BODY)
    wait_until(lambda: broker.board("commitlog.dispatched") == broker.board("commitlog.written"),
               message="dispatch to catch up")
    pid = broker.node.actor("net-0")["pid"]
    offset, served = 0, 0
    while True:
        r = broker.call(pull_command("Pages", 0, offset, max_nums=32, group="PagesGroup"), timeout=30)
        if r.code != ResponseCode.SUCCESS:
            break
        served += len(r.body_bytes())
        offset = int(r.ext_fields["nextBeginOffset"])
    assert served >= SERVED
    assert commitlog_rss(pid) < MAPPED_MAX
