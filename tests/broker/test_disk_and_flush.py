"""The disk watermarks (cleanup actor, injected usage), file deletion, sync flush acknowledgements, and
the pull limits of records outside the memory window."""

from __future__ import annotations

import json
import os
import time

import psutil

from tests.support.broker import group_command, offset_command, pull_command, restart_broker, send_command
from smartgo.cli.main import main
from smartgo.client import Admin
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.store.record import decode_records, parse_offset_msg_id
from tests.support.waits import wait_until


def test_disk_full_refuses_sends_with_a_remark_while_pulls_go_on(start_node, tmp_path):
    usage = tmp_path / "usage"
    usage.write_text("0.5")
    broker = start_node({"disk_usage_file": str(usage)})
    assert broker.call(send_command("Full", b"before")).code == ResponseCode.SUCCESS
    usage.write_text("0.93")
    wait_until(lambda: broker.board("flag.disk_full") == 1, message="the disk-full flag")
    refused = broker.call(send_command("Full", b"during"))
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "disk is full" in refused.remark
    pulled = broker.call(pull_command("Full", 0, 0))
    assert pulled.code == ResponseCode.SUCCESS and decode_records(pulled.body_bytes())[0].body == b"before"
    usage.write_text("0.88")                               # between 85 and 90: still full (hysteresis)
    wait_until(lambda: broker.board("disk.used_permille") == 880)
    assert broker.call(send_command("Full", b"still")).code == ResponseCode.SERVICE_NOT_AVAILABLE
    usage.write_text("0.80")
    wait_until(lambda: broker.board("flag.disk_full") == 0, message="the flag to drop")
    assert broker.call(send_command("Full", b"after")).code == ResponseCode.SUCCESS
    broker.node.logged("refusing sends")


def test_forced_cleanup_deletes_old_files_and_pulls_below_the_minimum_move(start_node, tmp_path):
    """Over the force-clean watermark the oldest CommitLog files go whatever their age (never the
    newest); ConsumeQueue files below the new minimum too; an old offset then gets OFFSET_TOO_SMALL."""
    usage = tmp_path / "usage"
    usage.write_text("0.1")
    broker = start_node({"disk_usage_file": str(usage), "commitlog_file_size": 64 * 1024,
                         "consume_queue_file_size": 20 * 100, "topics": "Old:1"})
    body = b"z" * 1000
    for _ in range(200):                                   # ~220 KB: four 64 KiB CommitLog files
        assert broker.call(send_command("Old", body)).code == ResponseCode.SUCCESS
    files = broker.node.store / "commitlog"
    assert len(list(files.iterdir())) >= 4
    wait_until(lambda: broker.board("commitlog.dispatched") == broker.board("commitlog.written"))
    usage.write_text("0.87")
    wait_until(lambda: broker.board("commitlog.min") > 0, message="files to be deleted")
    usage.write_text("0.1")
    assert len(list(files.iterdir())) >= 1
    minimum = broker.board("commitlog.min")
    min_offset = int(broker.call(offset_command(RequestCode.GET_MIN_OFFSET, "Old", 0)).ext_fields["offset"])
    assert min_offset > 0
    r = broker.call(pull_command("Old", 0, 0))
    assert (r.code, r.remark) == (ResponseCode.PULL_OFFSET_MOVED, "OFFSET_TOO_SMALL")
    assert int(r.ext_fields["nextBeginOffset"]) == int(r.ext_fields["minOffset"]) == min_offset
    again = broker.call(pull_command("Old", 0, min_offset))
    assert again.code == ResponseCode.SUCCESS
    assert decode_records(again.body_bytes())[0].commit_log_offset >= minimum
    assert not (broker.node.store / "consumequeue" / "Old" / "0" / f"{0:020d}").exists()
    # a new group's first offset query: message 0 is gone, so the client decides (consumeFromWhere)
    query = broker.call(group_command(RequestCode.QUERY_CONSUMER_OFFSET, "NewGroup", topic="Old", queueId=0))
    assert query.code == ResponseCode.QUERY_NOT_FOUND


def test_deletions_asked_for_run_now_whatever_the_hour(start_node, tmp_path, capsys):
    """`smartgo admin delete-expired-commitlog` (DELETE_EXPIRED_COMMITLOG) deletes the files older than
    file_reserved_hours at once, outside delete_when's hour; `clean-expired-cq` (CLEAN_EXPIRED_CONSUMEQUEUE)
    the ConsumeQueue files below the minimum, which a file deleted while the node was down leaves."""
    usage = tmp_path / "usage"
    usage.write_text("0.1")
    elsewhen = f"{(time.localtime().tm_hour + 12) % 24:02d}"
    broker = start_node({"disk_usage_file": str(usage), "commitlog_file_size": 64 * 1024, "delete_when": elsewhen,
                         "consume_queue_file_size": 20 * 50, "topics": "Aged:1", "file_reserved_hours": 1.0,
                         "cleanup_interval": 0.2})
    for _ in range(200):                                   # ~220 KB: four 64 KiB CommitLog files
        assert broker.call(send_command("Aged", b"a" * 1000)).code == ResponseCode.SUCCESS
    wait_until(lambda: broker.board("commitlog.dispatched") == broker.board("commitlog.written"))
    files = sorted((broker.node.store / "commitlog").iterdir())
    assert len(files) >= 4
    hours_ago = time.time() - 2 * 3600
    for f in files[:2]:                                    # two files past file_reserved_hours
        os.utime(f, (hours_ago, hours_ago))
    usage.write_text("0.11")
    wait_until(lambda: broker.board("disk.used_permille") == 110)      # a periodic pass since: not the hour,
    assert broker.board("commitlog.min") == 0                           # so it kept them

    cli = ["--registry", broker.registry, "--json", "--broker", broker.addr]
    assert main(["admin", "delete-expired-commitlog", *cli]) == 0
    minimum = json.loads(capsys.readouterr().out)["brokers"][broker.addr]
    assert minimum == 2 * 64 * 1024 == broker.board("commitlog.min")    # answered after the deletion
    assert sorted((broker.node.store / "commitlog").iterdir()) == files[2:]
    assert not (broker.node.store / "consumequeue" / "Aged" / "0" / f"{0:020d}").exists()
    broker.node.logged("expired CommitLog files deleted as asked")

    broker.node.stop()                                     # a file deleted by hand leaves its queue files
    (broker.node.store / "commitlog" / files[2].name).unlink()
    queue_files = broker.node.store / "consumequeue" / "Aged" / "0"
    before = sorted(queue_files.iterdir())
    broker.node = restart_broker(broker.node)
    assert broker.board("commitlog.min") == 3 * 64 * 1024
    assert main(["admin", "clean-expired-cq", *cli]) == 0
    assert json.loads(capsys.readouterr().out)["brokers"][broker.addr] == 3 * 64 * 1024
    after = sorted(queue_files.iterdir())
    assert after and set(after) < set(before)              # the head files go, the newest stays
    min_offset = int(broker.call(offset_command(RequestCode.GET_MIN_OFFSET, "Aged", 0)).ext_fields["offset"])
    first = broker.call(pull_command("Aged", 0, min_offset))
    assert first.code == ResponseCode.SUCCESS
    assert decode_records(first.body_bytes())[0].commit_log_offset >= 3 * 64 * 1024


def test_a_deleted_topics_expired_queues_go_at_the_next_start(start_node, tmp_path):
    """Retention keeps each queue's newest ConsumeQueue file; a deleted topic's, once every message in
    it has expired, goes at the next start (not a configured topic's), and the topic made again starts
    at offset 0."""
    usage = tmp_path / "usage"
    usage.write_text("0.1")
    elsewhen = f"{(time.localtime().tm_hour + 12) % 24:02d}"
    broker = start_node({"disk_usage_file": str(usage), "commitlog_file_size": 64 * 1024, "delete_when": elsewhen,
                         "consume_queue_file_size": 20 * 50, "topics": "Kept:1,Quiet:1", "file_reserved_hours": 1.0})
    queues = broker.node.store / "consumequeue"
    with Admin(broker.registry) as admin:
        admin.create_topic("Gone", 1, broker_addr=broker.addr)
        for topic in ("Gone", "Quiet"):
            for _ in range(5):
                assert broker.call(send_command(topic, b"old")).code == ResponseCode.SUCCESS
        for _ in range(250):
            assert broker.call(send_command("Kept", b"k" * 1000)).code == ResponseCode.SUCCESS
        admin.delete_topic("Gone")
        old = time.time() - 2 * 3600
        for f in sorted((broker.node.store / "commitlog").iterdir())[:2]:
            os.utime(f, (old, old))
        assert admin.delete_expired_commitlog(broker_addr=broker.addr) == {broker.addr: 2 * 64 * 1024}
        assert (queues / "Gone" / "0").is_dir()                # its newest file: kept while the node runs
        broker.node.stop()
        broker.node = restart_broker(broker.node)
        assert not (queues / "Gone").exists()
        assert (queues / "Quiet" / "0").is_dir() and (queues / "Kept" / "0").is_dir()
        broker.node.logged("deleted 1 queues of deleted topics, every message in them expired: Gone:0")
        admin.create_topic("Gone", 1, broker_addr=broker.addr)
    again = broker.call(send_command("Gone", b"new"))
    assert again.code == ResponseCode.SUCCESS and again.ext_fields["queueOffset"] == "0"
    pulled = wait_until(lambda: decode_records(broker.call(pull_command("Gone", 0, 0)).body_bytes()),
                        message="the new message dispatched")      # acknowledged before dispatch
    assert [m.body for m in pulled] == [b"new"]


def test_sync_flush_acknowledges_only_flushed_sends_and_times_out_without_flush(start_node):
    broker = start_node({"flush": "sync", "sync_flush_timeout": 1.0})
    for i in range(20):
        r = broker.call(send_command("Durable", b"d%d" % i))
        flushed = broker.board("commitlog.flushed")
        assert r.code == ResponseCode.SUCCESS, r.remark
        _, _, phys = parse_offset_msg_id(r.ext_fields["msgId"])
        assert flushed > phys, "a sync-flush send was acknowledged before it was flushed"
    flush = psutil.Process(broker.node.actor("flush")["pid"])
    flush.suspend()                                       # the disk "hangs"
    try:
        slow = broker.call(send_command("Durable", b"stuck"), timeout=5)
    finally:
        flush.resume()
    assert slow.code == ResponseCode.FLUSH_DISK_TIMEOUT
    assert slow.ext_fields["msgId"] and slow.ext_fields["queueOffset"] == "20"   # stored, just not on disk yet
    r = broker.call(send_command("Durable", b"unstuck"))
    assert r.code == ResponseCode.SUCCESS


def test_async_flush_acknowledges_before_the_flush(start_node):
    broker = start_node({"flush_interval": 30.0})
    r = broker.call(send_command("Quick", b"q"))
    assert r.code == ResponseCode.SUCCESS
    assert broker.board("commitlog.flushed") < broker.board("commitlog.written")   # under 4 dirty pages: not yet


def test_pulls_of_records_outside_the_memory_window_get_the_disk_limits(start_node):
    """access_message_in_memory_max_ratio 0: every record counts as in disk (RocketMQ's
    isTheBatchFull), so a pull of 32 records of 5,000 bytes gets 64 KiB of them (in memory: 256
    KiB), and a new group's first offset is not 0."""
    broker = start_node({"access_message_in_memory_max_ratio": 0, "topics": "Cold:1"})
    bodies = [(b"c%d-" % i).ljust(5000, b"c") for i in range(20)]
    for body in bodies:
        assert broker.call(send_command("Cold", body)).code == ResponseCode.SUCCESS
    wait_until(lambda: broker.board("commitlog.dispatched") == broker.board("commitlog.written"))
    r = broker.call(pull_command("Cold", 0, 0, max_nums=32))
    assert r.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(r.body_bytes())] == bodies[:12]             # 12 x ~5.1 KB <= 64 KiB
    assert r.ext_fields["nextBeginOffset"] == "12" and r.ext_fields["maxOffset"] == "20"
    query = broker.call(group_command(RequestCode.QUERY_CONSUMER_OFFSET, "ColdGroup", topic="Cold", queueId=0))
    assert query.code == ResponseCode.QUERY_NOT_FOUND


def test_a_clean_stop_records_its_end_and_the_restart_checks_from_there(start_node):
    """The flush actor's clean stop writes the CommitLog's end into the checkpoint; the next start
    walks from there instead of the last three files (its log says so), consumes it, and serves
    every message and the next offset."""
    from smartgo.store.checkpoint import Checkpoint
    broker = start_node({"topics": "Clean:2", "commitlog_file_size": 1 << 14})
    for i in range(200):
        assert broker.call(send_command("Clean", b"m%d " % i + b"x" * 300, queue_id=i % 2)).code == ResponseCode.SUCCESS
    written = broker.board("commitlog.written")
    assert written > 3 << 14                                   # more files than a full check walks
    assert broker.node.stop() == 0
    checkpoint = Checkpoint(broker.node.store / "checkpoint")
    try:
        assert checkpoint.clean_end == written == checkpoint.physic_offset
    finally:
        checkpoint.close()
    broker.node = restart_broker(broker.node)
    broker.node.logged(f"commitlog valid from {written} to {written} (normal, from the clean stop's end")
    for q in (0, 1):
        bodies, offset = [], 0
        while (r := broker.call(pull_command("Clean", q, offset))).code == ResponseCode.SUCCESS:
            bodies += [m.body.split(b" ")[0] for m in decode_records(r.body_bytes(), check_crc=True)]
            offset = int(r.ext_fields["nextBeginOffset"])
        assert bodies == [b"m%d" % i for i in range(q, 200, 2)]
    assert broker.call(send_command("Clean", b"after", queue_id=0)).ext_fields["queueOffset"] == "100"
    checkpoint = Checkpoint(broker.node.store / "checkpoint")
    try:
        assert checkpoint.clean_end == 0                       # used: a crash from here is checked in full
    finally:
        checkpoint.close()


def test_a_clean_restart_reads_no_queue_file(start_node):
    """Dispatch saves every queue's end when it stops; after a clean stop recovery takes them
    instead of reading each queue's last file (with the page cache full of CommitLog, disk reads:
    ~50 s at 10,000 queues), and so does dispatch's first incarnation. A queue is read when
    first written, and every offset goes on where it was."""
    broker = start_node({"topics": "Wide:300"})
    for q in range(300):
        assert broker.call(send_command("Wide", b"w%d" % q, queue_id=q)).code == ResponseCode.SUCCESS
    assert broker.call(send_command("Wide", b"again", queue_id=7)).code == ResponseCode.SUCCESS
    wait_until(lambda: broker.board("commitlog.dispatched") == broker.board("commitlog.written"))
    assert broker.node.stop() == 0
    broker.node = restart_broker(broker.node)
    broker.node.logged("(0 read from their files)")
    dispatch = next(a["pid"] for a in broker.node.health()["actors"] if a["name"] == "dispatch")

    def mapped_queue_files() -> int:
        with open(f"/proc/{dispatch}/maps") as f:
            return sum("/consumequeue/" in line for line in f)
    assert mapped_queue_files() == 0
    r = broker.call(send_command("Wide", b"after", queue_id=7))
    assert r.ext_fields["queueOffset"] == "2"
    assert broker.call(send_command("Wide", b"after", queue_id=299)).ext_fields["queueOffset"] == "1"
    wait_until(lambda: broker.board("commitlog.dispatched") == broker.board("commitlog.written"))
    r = broker.call(pull_command("Wide", 7, 0))
    assert [m.body for m in decode_records(r.body_bytes())] == [b"w7", b"again", b"after"]
    assert 1 <= mapped_queue_files() <= 4
