"""A node restarted on a store with a damaged flushed record serves every other message; so does a
running node whose dispatch meets the damage; and damage in old data that the background scrub
lists is repaired at the next start."""

from __future__ import annotations

import json

import psutil
import pytest

from tests.support.broker import pull_command, restart_broker, send_command
from smartgo.net.codes import ResponseCode
from smartgo.net.errors import RemotingError
from smartgo.store.mapped_file import segment_name
from smartgo.store.record import POS_BODY, POS_MAGIC, decode_records, parse_offset_msg_id
from tests.support.waits import wait_until

TOPIC = "Rot"


def pull_bodies(broker) -> list[bytes]:
    """The number in every message of the topic, CRC-checked (the pull walks past offset 30's hole)."""
    bodies, offset = [], 0
    while True:
        r = broker.call(pull_command(TOPIC, 0, offset))
        if r.code != ResponseCode.SUCCESS:
            return bodies
        bodies += [m.body.split(b" ")[1] for m in decode_records(r.body_bytes(), check_crc=True)]
        offset = int(r.ext_fields["nextBeginOffset"])


@pytest.mark.timeout(90)
def test_a_damaged_record_loses_only_its_message_after_a_restart(start_node):
    # trust_clean_stop off: the start after a clean stop walks the last files (the default leaves
    # damage made while stopped to the background scrub, as the last test here shows for old data)
    broker = start_node({"topics": f"{TOPIC}:1", "commitlog_file_size": 1 << 16, "trust_clean_stop": False})
    sent = []
    for i in range(60):
        r = broker.call(send_command(TOPIC, b"message %d " % i + b"x" * 200))
        assert r.code == ResponseCode.SUCCESS
        sent.append(parse_offset_msg_id(r.ext_fields["msgId"])[2])
    assert broker.node.stop() == 0                             # a clean stop flushes everything
    phys = sent[30]
    path = broker.node.store / "commitlog" / segment_name(phys - phys % (1 << 16))
    with open(path, "r+b") as f:                               # one flipped bit in a flushed body
        f.seek(phys % (1 << 16) + POS_BODY + 3)
        byte = f.read(1)[0]
        f.seek(phys % (1 << 16) + POS_BODY + 3)
        f.write(bytes([byte ^ 1]))
    broker.node = restart_broker(broker.node)
    assert pull_bodies(broker) == [b"%d" % i for i in range(60) if i != 30]
    assert broker.call(send_command(TOPIC, b"after")).ext_fields["queueOffset"] == "60"
    broker.node.logged("fail the record checks below the flushed offset", "replaced by a filler")
    assert len(list((broker.node.store / "damaged").iterdir())) == 1


@pytest.mark.timeout(120)
def test_damage_met_by_the_running_dispatch_is_repaired_by_the_node_itself(start_node):
    """A record damaged after it was flushed but before dispatch read it: dispatch fails on it until
    its restart intensity restarts the node, whose recovery replaces the damage; every other
    message is served and the queue offset is not reused."""
    # the last partial page is flushed by a thorough round only (10 s by default, as long as the wait)
    broker = start_node({"topics": f"{TOPIC}:1", "commitlog_file_size": 1 << 16, "flush_thorough_interval": 0.5})
    dispatch = psutil.Process(broker.node.actor("dispatch")["pid"])
    dispatch.suspend()
    sent = []
    for i in range(60):
        r = broker.call(send_command(TOPIC, b"message %d " % i + b"x" * 200))
        assert r.code == ResponseCode.SUCCESS
        sent.append(parse_offset_msg_id(r.ext_fields["msgId"])[2])
    wait_until(lambda: broker.board("commitlog.flushed") >= broker.board("commitlog.written"), message="the flush")
    phys = sent[30]
    with open(broker.node.store / "commitlog" / segment_name(phys - phys % (1 << 16)), "r+b") as f:
        f.seek(phys % (1 << 16) + POS_MAGIC)
        f.write(bytes(4))                                      # its MAGIC zeroed, through the page cache
    dispatch.resume()
    def served() -> int:
        try:
            return len(pull_bodies(broker))
        except RemotingError:                                  # refused while the node restarts
            return 0
    wait_until(lambda: served() == 59, timeout=60, interval=0.2, message="the node to repair itself")
    assert pull_bodies(broker) == [b"%d" % i for i in range(60) if i != 30]
    after = broker.call(send_command(TOPIC, b"after"))
    assert after.code == ResponseCode.SUCCESS and after.ext_fields["queueOffset"] == "60"
    broker.node.logged("restarting the node")
    assert (broker.node.store / "damaged").is_dir()


@pytest.mark.timeout(120)
def test_the_background_scrub_finds_rot_in_old_data_and_the_next_start_repairs_it(start_node):
    """A flipped bit in a file recovery's walk never reads: the running node's scrub logs and lists
    it; after a restart the message is gone, everything else is served, the list consumed."""
    broker = start_node({"topics": f"{TOPIC}:1", "commitlog_file_size": 1 << 16, "scrub_delay": 0,
                         "scrub_interval": 0.2, "scrub_rate_mb": 64})
    sent = []
    for i in range(600):                                       # ~10 files of 64 KiB
        r = broker.call(send_command(TOPIC, b"message %d " % i + b"x" * 200))
        assert r.code == ResponseCode.SUCCESS
        sent.append(parse_offset_msg_id(r.ext_fields["msgId"])[2])
    phys = sent[30]                                            # in the first file
    wait_until(lambda: broker.board("commitlog.flushed") > sent[100], timeout=30, message="the first files' flush")
    with open(broker.node.store / "commitlog" / segment_name(0), "r+b") as f:
        f.seek(phys + POS_BODY + 3)
        byte = f.read(1)[0]
        f.seek(phys + POS_BODY + 3)
        f.write(bytes([byte ^ 1]))
    wait_until(lambda: broker.board("scrub.damaged") >= 1, timeout=30, message="the scrub to find the damage")
    broker.node.logged("background scrub")
    found = broker.node.store / "damaged" / "found.jsonl"
    assert [json.loads(line)["begin"] for line in found.read_text().splitlines()] == [phys]
    assert broker.node.stop() == 0
    broker.node = restart_broker(broker.node)
    assert pull_bodies(broker) == [b"%d" % i for i in range(600) if i != 30]
    assert not found.exists() and list((broker.node.store / "damaged").glob("commitlog-*.bin"))
