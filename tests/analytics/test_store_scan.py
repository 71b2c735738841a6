"""The CommitLog scan under the data source (no Spark session): exact records, rolls, torn tails,
spans, and the Arrow batches built from its chunks."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from analytics.datasource import message_schema, to_record_batch
from analytics.store_scan import (
    ScanFilter, Span, commitlog_dir, file_spans, format_host, list_spans, prune, scan_span,
)
from smartgo.store import record_columns
from smartgo.store.mapped_file import segment_name
from smartgo.store.record import (
    BORNHOST_V6_FLAG, HEADER_V4_SIZE, INT32, INT64, POS_BORNHOST, POS_PHYSICALOFFSET, POS_STOREHOST, POS_SYSFLAG,
    POS_TOTALSIZE, STOREHOST_V6_FLAG, decode_record, encode_properties, encode_record, pack_host,
)

from .conftest import build_store

PLAN = [("TopicA", 0, 25), ("TopicB", 1, 15), ("TopicA", 1, 20), ("TopicC", 0, 10)]
FULL = to_arrow_schema(message_schema(True), timezone="UTC")


def rows_of(chunks, schema: pa.Schema = FULL) -> list[dict]:
    return [row for chunk in chunks for row in to_record_batch(chunk, schema).to_pylist()]


def scan_all(root, flt: ScanFilter = ScanFilter(), split: int = 1 << 40) -> list[dict]:
    return rows_of(chunk for span in list_spans(root, split) for chunk in scan_span(span, flt))


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
        for key in ("topic", "queue_id", "queue_offset", "commit_log_offset", "msg_id", "body", "store_timestamp_ms",
                    "keys", "tags"):
            assert got[key] == want[key], key
        assert dict(got["properties"]) == want["properties"] and got["uniq_key"] is None
        assert got["born_host"] == "10.1.2.3:4567" and got["store_host"] == "127.0.0.1:10911"
        assert got["body_size"] == 100 and got["store_timestamp"].timestamp() * 1000 == want["store_timestamp_ms"]
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


def test_a_narrow_schema_builds_only_its_columns(stored, monkeypatch):
    """Unwanted parts are never decoded: no properties parse without a property column."""
    def no_parse(*_):
        raise AssertionError("properties parsed for a schema without them")

    monkeypatch.setattr(record_columns, "properties", no_parse)
    narrow = pa.schema([FULL.field("topic"), FULL.field("queue_offset"), FULL.field("body_size")])
    rows = rows_of(scan_span(list_spans(stored.root)[0]), narrow)
    assert rows[0] == {"topic": "TopicA", "queue_offset": 0, "body_size": 100}
    with pytest.raises(AssertionError, match="properties parsed"):
        rows_of(scan_span(list_spans(stored.root)[0]), pa.schema([FULL.field("tags")]))


def test_torn_tail_is_skipped(tmp_path, caplog):
    s = build_store(tmp_path / "store", [("TopicA", 0, 12)], file_size=64 * 1024)
    last = files_of(s.root)[-1]
    end = s.rows[-1]["commit_log_offset"] + 250  # records are 250 bytes here
    with open(last, "r+b") as f:
        f.truncate(end - 100)  # the last record is cut in its body
    with caplog.at_level(logging.INFO, "smartgo.analytics.store_scan"):
        rows = scan_all(s.root)
    assert [r["queue_offset"] for r in rows] == list(range(11))
    assert f"data ends at {s.rows[-1]['commit_log_offset']} (torn" in caplog.text


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


def edge_record(topic: str, body: bytes, props: bytes, v6_born: bool = False, v6_store: bool = False) -> bytes:
    """A stamped record; IPv6 hosts spliced in as a Java broker writes them."""
    raw = bytearray(encode_record(topic, 2, body, props, born_timestamp=7, born_host=pack_host("10.0.0.1", 99),
                                  store_host=pack_host("127.0.0.1", 10911), store_timestamp=1_795_000_000_000))
    flags = 0
    if v6_store:
        raw[POS_STOREHOST:POS_STOREHOST + 8] = bytes(15) + b"\x01" + INT32.pack(10911)  # [::1]:10911
        flags |= STOREHOST_V6_FLAG
    if v6_born:
        raw[POS_BORNHOST:POS_BORNHOST + 8] = bytes(15) + b"\x01" + INT32.pack(1234)  # [::1]:1234
        flags |= BORNHOST_V6_FLAG
    INT32.pack_into(raw, POS_TOTALSIZE, len(raw))
    INT32.pack_into(raw, POS_SYSFLAG, flags)
    return bytes(raw)


def test_edge_records_equal_decode_record(tmp_path):
    """IPv6 hosts (Java brokers may store them), odd properties and bodies: every column of
    the Arrow rows is what decode_record gives."""
    records = [
        edge_record("TopicV6", b"payload", encode_properties({"KEYS": "a b", "TAGS": "t"}), v6_born=True),
        edge_record("TopicV6", b"", b"", v6_store=True),
        edge_record("TopicV6", b"x", b"KEYS\x01 k1  k2 \x02TAGS\x01a\x02TAGS\x01b", v6_born=True, v6_store=True),
        edge_record("TopicE", b"y" * 5000, "KEYS\x01键 值\x02UNIQ_KEY\x01U1".encode()),
        edge_record("TopicE", b"z", b"TAGS\x01\xff\x02KEYS\x01\x02\x01v"),
    ]
    data = bytearray()
    for raw in records:
        at = len(data)
        data += raw
        INT64.pack_into(data, at + POS_PHYSICALOFFSET, at)
    folder = tmp_path / "commitlog"
    folder.mkdir()
    (folder / segment_name(0)).write_bytes(bytes(data) + bytes(4096))
    spans = file_spans(str(folder / segment_name(0)), 0)
    rows = rows_of(scan_span(spans[0], max_rows=2))
    assert len(rows) == len(records)
    pos = 0
    for row in rows:
        m = decode_record(data, pos)
        pos += m.store_size
        assert (row["topic"], row["queue_id"], row["commit_log_offset"], row["msg_id"], row["sys_flag"]) == \
            (m.topic, m.queue_id, m.commit_log_offset, m.msg_id, m.sys_flag)
        assert (row["born_host"], row["store_host"]) == (format_host(m.born_host), format_host(m.store_host))
        assert (row["tags"], row["keys"], row["uniq_key"]) == (m.tags, m.keys, m.uniq_key)
        assert row["properties"] == list(m.properties.items())
        assert (row["body"], row["body_size"], row["store_timestamp_ms"], row["born_timestamp_ms"]) == \
            (m.body, len(m.body), m.store_timestamp, m.born_timestamp)
    assert rows[0]["born_host"] == "[::1]:1234" and rows[1]["store_host"] == "[::1]:10911"
    assert rows[2]["keys"] == ["k1", "k2"] and rows[2]["tags"] == "b" and len(rows[2]["msg_id"]) == 56
    assert rows[3]["keys"] == ["键", "值"] and rows[4]["tags"] == "\ufffd" and rows[4]["keys"] == []


def test_a_filter_that_matches_nothing_yields_no_chunk(stored):
    span = list_spans(stored.root)[0]
    assert list(scan_span(span, ScanFilter(topics=frozenset({"Nope"})))) == []
    assert list(scan_span(span, ScanFilter(until_ms=1))) == []


def test_format_host():
    assert format_host(("10.0.0.1", 80)) == "10.0.0.1:80"
    assert format_host(("::1", 80)) == "[::1]:80"


def test_rows_come_in_chunks(stored):
    span = list_spans(stored.root)[0]
    whole = rows_of(scan_span(span))
    chunks = list(scan_span(span, max_rows=7))
    assert [len(c.topic_index) for c in chunks[:-1]] == [7] * (len(chunks) - 1) and 0 < len(chunks[-1].topic_index) <= 7
    assert rows_of(chunks) == whole
    by_bytes = list(scan_span(span, max_bytes=600))  # 250-byte records: 3 start in each 600 bytes
    assert [len(c.topic_index) for c in by_bytes[:-1]] == [3] * (len(by_bytes) - 1)
    assert rows_of(by_bytes) == whole


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
    log, complete and in order, and the last one sees everything. The writer pauses after
    every 100 messages until the scan running meanwhile is done, so at least 20 scans overlap
    its writes however fast either side is."""
    from smartgo.store import Message, MessageStore
    from tests.support.waits import wait_until

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
                if i % 100 == 99:
                    seen_scans = scans
                    wait_until(lambda: scans > seen_scans + 1 or stop.is_set(), timeout=30)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_until(lambda: (tmp_path / "store" / "commitlog").is_dir() and written, timeout=10)
        seen = [0]
        while thread.is_alive():
            offsets = [q for span in list_spans(tmp_path / "store", 4096) for chunk in scan_span(span)
                       for q in chunk.columns.queue_offset.tolist()]
            assert offsets == list(range(len(offsets)))  # a gapless prefix, nothing torn
            assert len(offsets) >= seen[-1]
            seen.append(len(offsets))
            scans += 1
    finally:
        stop.set()
        thread.join(30)
    assert scans >= 20 and len(written) < 20_000 and seen[1] < len(written)  # scans overlapped the writes
    assert [r["queue_offset"] for r in scan_all(tmp_path / "store")] == list(range(len(written)))
