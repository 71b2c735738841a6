"""The CommitLog scan under the data source (no Spark): exact records, rolls, torn tails, spans."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from analytics.store_scan import (
    ROW_FIELDS, ScanFilter, Span, Wanted, commitlog_dir, file_spans, format_host, list_spans, prune, scan_span,
)
from smartgo.store.mapped_file import segment_name
from smartgo.store.record import (
    BORNHOST_V6_FLAG, HEADER_V4_SIZE, INT32, POS_BORNHOST, POS_SYSFLAG, POS_TOTALSIZE, encode_properties,
    encode_record, pack_host,
)

from .conftest import build_store

PLAN = [("TopicA", 0, 25), ("TopicB", 1, 15), ("TopicA", 1, 20), ("TopicC", 0, 10)]


def scan_all(root, flt: ScanFilter = ScanFilter(), split: int = 1 << 40, wanted: Wanted = Wanted(body=True)):
    return [dict(zip(ROW_FIELDS, row)) for span in list_spans(root, split) for chunk in scan_span(span, flt, wanted)
            for row in chunk]


def files_of(root: Path) -> list[Path]:
    return sorted((root / "commitlog").iterdir())


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("scan") / "store", PLAN)


def test_scan_returns_exactly_what_was_stored_across_rolls(stored):
    assert len(files_of(stored.root)) >= 3  # 8 KiB files: the log rolled (BLANK fillers inside)
    rows = scan_all(stored.root)
    assert len(rows) == 70
    for got, want in zip(rows, stored.rows):
        for key in ("topic", "queue_id", "queue_offset", "commit_log_offset", "msg_id", "body"):
            assert got[key] == want[key], key
        assert got["store_timestamp"] == want["store_timestamp_ms"]
        assert got["properties"] == want["properties"]
        assert got["born_host"] == "10.1.2.3:4567" and got["store_host"] == "127.0.0.1:10911"
        assert got["body_size"] == 100
    assert [r["queue_offset"] for r in rows if (r["topic"], r["queue_id"]) == ("TopicA", 1)] == list(range(20))


def test_scan_is_read_only(stored):
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files_of(stored.root)}
    scan_all(stored.root, split=4096)
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files_of(stored.root)} == before


@pytest.mark.parametrize("split", [4096, 5000, 16384])
def test_spans_split_files_without_losing_or_repeating_records(stored, split):
    spans = list_spans(stored.root, split)
    assert (len(spans) > len(files_of(stored.root))) == (split < 8192)  # 8 KiB files
    rows = scan_all(stored.root, split=split)
    assert [r["commit_log_offset"] for r in rows] == [r["commit_log_offset"] for r in stored.rows]


def test_topic_and_time_filters(stored):
    rows = scan_all(stored.root, ScanFilter(topics=frozenset({"TopicB", "TopicC"})))
    assert [r["topic"] for r in rows] == ["TopicB"] * 15 + ["TopicC"] * 10
    times = [r["store_timestamp_ms"] for r in stored.rows]
    since, until = times[10], times[30]
    rows = scan_all(stored.root, ScanFilter(since_ms=since, until_ms=until))
    assert [r["commit_log_offset"] for r in rows] == [r["commit_log_offset"] for r in stored.rows[10:30]]


def test_prune_drops_spans_outside_the_range(stored):
    spans = list_spans(stored.root, 4096)
    firsts = [s.first_store_ts for s in spans]
    assert firsts == sorted(firsts) and None not in firsts
    late = ScanFilter(since_ms=firsts[-1] + 1, skew_ms=0)
    assert prune(spans, late) == spans[-1:]
    early = ScanFilter(until_ms=firsts[1], skew_ms=0)
    assert prune(spans, early) == spans[:1]
    # with skew slack nothing that might hold an early-stamped record is dropped
    assert prune(spans, ScanFilter(until_ms=firsts[1], skew_ms=10**9)) == spans


def test_unwanted_parts_come_back_empty(stored):
    row = scan_all(stored.root, wanted=Wanted(properties=False, msg_id=False, body=False))[0]
    assert row["properties"] == {} and row["msg_id"] == "" and row["body"] is None and row["body_size"] == 100


def test_torn_tail_is_skipped(tmp_path):
    s = build_store(tmp_path / "store", [("TopicA", 0, 12)], file_size=64 * 1024)
    last = files_of(s.root)[-1]
    end = s.rows[-1]["commit_log_offset"] + 250  # records are 250 bytes here
    with open(last, "r+b") as f:
        f.truncate(end - 100)  # the last record is cut in its body
    rows = scan_all(s.root)
    assert [r["queue_offset"] for r in rows] == list(range(11))


def test_garbage_after_the_last_record_is_ignored(tmp_path):
    s = build_store(tmp_path / "store", [("TopicA", 0, 12)], file_size=64 * 1024)
    last = files_of(s.root)[-1]
    end = s.rows[-1]["commit_log_offset"] + 250
    with open(last, "r+b") as f:
        f.seek(end)
        f.write(os.urandom(600))
    assert len(scan_all(s.root)) == 12
    assert len(scan_all(s.root, split=4096)) == 12  # a span starting in the garbage finds nothing


def test_corrupt_body_ends_the_data(tmp_path):
    s = build_store(tmp_path / "store", [("TopicA", 0, 12)], file_size=64 * 1024)
    last = files_of(s.root)[-1]
    with open(last, "r+b") as f:
        f.seek(s.rows[8]["commit_log_offset"] + HEADER_V4_SIZE + 5)
        f.write(b"#")  # body CRC of record 8 no longer matches
    assert [r["queue_offset"] for r in scan_all(s.root)] == list(range(8))


def test_record_not_yet_stamped_ends_the_data(tmp_path):
    """The commit actor copies a record in, then patches offsets and store time: a reader
    that sees the copy before the patch must stop there."""
    s = build_store(tmp_path / "store", [("TopicA", 0, 3)], file_size=64 * 1024)
    last = files_of(s.root)[-1]
    end = s.rows[-1]["commit_log_offset"] + 250
    unstamped = encode_record("TopicA", 0, b"x" * 100, born_timestamp=5, born_host=pack_host("10.1.2.3", 1),
                              store_host=pack_host("127.0.0.1", 10911), physical_offset=end)
    with open(last, "r+b") as f:
        f.seek(end)
        f.write(unstamped)
    assert len(scan_all(s.root)) == 3


def test_missing_and_empty_stores(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_spans(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="commitlog"):
        list_spans(tmp_path / "empty")
    (tmp_path / "s" / "commitlog").mkdir(parents=True)
    assert list_spans(tmp_path / "s") == []
    zero = tmp_path / "s" / "commitlog" / segment_name(0)
    zero.write_bytes(bytes(4096))
    spans = list_spans(tmp_path / "s")
    assert spans == [Span(str(zero), 0, 0, None, None)]
    assert list(scan_span(spans[0])) == []
    assert commitlog_dir(tmp_path / "s" / "commitlog") == tmp_path / "s" / "commitlog"


def test_a_deleted_file_reads_as_empty(tmp_path):
    s = build_store(tmp_path / "store", [("TopicA", 0, 3)])
    spans = list_spans(s.root)
    os.unlink(spans[0].path)  # cleanup removed it between planning and reading
    assert list(scan_span(spans[0])) == []


def test_ipv6_born_host_takes_the_full_decoder(tmp_path):
    """Java brokers may store IPv6 born hosts (16-byte address): decode_record handles them."""
    v4 = encode_record("TopicV6", 2, b"payload", encode_properties({"KEYS": "a b"}), born_timestamp=7,
                       born_host=pack_host("10.0.0.1", 99), store_host=pack_host("127.0.0.1", 10911),
                       physical_offset=0, store_timestamp=1_795_000_000_000)
    v6_host = bytes(15) + b"\x01" + INT32.pack(1234)  # ::1 port 1234
    record = bytearray(v4[:POS_BORNHOST] + v6_host + v4[POS_BORNHOST + 8:])
    INT32.pack_into(record, POS_TOTALSIZE, len(record))
    INT32.pack_into(record, POS_SYSFLAG, BORNHOST_V6_FLAG)
    folder = tmp_path / "commitlog"
    folder.mkdir()
    (folder / segment_name(0)).write_bytes(bytes(record) + bytes(4096))
    spans = file_spans(str(folder / segment_name(0)), 0)
    rows = [dict(zip(ROW_FIELDS, r)) for chunk in scan_span(spans[0]) for r in chunk]
    assert len(rows) == 1
    row = rows[0]
    assert (row["topic"], row["queue_id"], row["born_host"], row["store_host"]) == \
        ("TopicV6", 2, "[::1]:1234", "127.0.0.1:10911")
    assert row["store_timestamp"] == 1_795_000_000_000 and row["properties"] == {"KEYS": "a b"}


def test_format_host():
    assert format_host(("10.0.0.1", 80)) == "10.0.0.1:80"
    assert format_host(("::1", 80)) == "[::1]:80"


def test_rows_come_in_chunks(stored):
    span = list_spans(stored.root)[0]
    whole = [row for chunk in scan_span(span) for row in chunk]
    chunks = list(scan_span(span, max_rows=7))
    assert [len(c) for c in chunks[:-1]] == [7] * (len(chunks) - 1) and 0 < len(chunks[-1]) <= 7
    assert [row for chunk in chunks for row in chunk] == whole
    by_bytes = list(scan_span(span, wanted=Wanted(body=True), max_body_bytes=250))
    assert [len(c) for c in by_bytes[:-1]] == [3] * (len(by_bytes) - 1)  # 100-byte bodies: cut after the 3rd


def test_records_longer_than_a_span_window_are_read_whole(tmp_path):
    """A 4 KiB window inside a 6 KB record has no record start: planning stops there and the
    previous span reads on to the end of the data."""
    s = build_store(tmp_path / "store", [("Big", 0, 9)], file_size=128 * 1024, body_size=6000)
    spans = list_spans(s.root, 4096)
    assert spans[-1].end is None
    rows = scan_all(s.root, split=4096)
    assert [r["queue_offset"] for r in rows] == list(range(9)) and {r["body_size"] for r in rows} == {6000}


def test_a_live_store_is_read_while_it_is_appended(tmp_path):
    """A writer keeps appending (and rolling) while scans run: every scan sees a prefix of the
    log, complete and in order, and the last one sees everything."""
    from smartgo.store import Message, MessageStore
    from smartgo.testing import wait_until

    from .conftest import Clock, small_store_config

    stop = threading.Event()
    written = []
    scans = 0

    def writer():  # keeps appending until the reader has scanned 20 times
        with MessageStore(small_store_config(tmp_path / "store"), clock=Clock()) as store:
            for i in range(20_000):
                store.put(Message("Live", bytes(50 + i % 200), properties={"KEYS": f"k{i}"}))
                written.append(i)
                if stop.is_set() or scans >= 20:
                    break

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_until(lambda: (tmp_path / "store" / "commitlog").is_dir() and written, timeout=10)
        seen = [0]
        while thread.is_alive():
            offsets = [r["queue_offset"] for r in scan_all(tmp_path / "store", split=4096)]
            assert offsets == list(range(len(offsets)))  # a gapless prefix, nothing torn
            assert len(offsets) >= seen[-1]
            seen.append(len(offsets))
            scans += 1
    finally:
        stop.set()
        thread.join(30)
    assert scans >= 20 and len(written) < 20_000 and seen[1] < len(written)  # scans overlapped the writes
    assert [r["queue_offset"] for r in scan_all(tmp_path / "store")] == list(range(len(written)))
