"""Columnar record decoding: every field equal to decode_record's, and the same stopping rules as
check_record (torn tail, BLANK filler, garbage, corrupt CRC, unstamped record)."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartgo.store.record import (
    BLANK_MAGIC, BORNHOST_V6_FLAG, COMPRESSED_FLAG, HEADER_V4_SIZE, INT32, INT64, MULTI_TAGS_FLAG,
    POS_PHYSICALOFFSET, POS_STOREHOST, POS_STORETIMESTAMP, POS_SYSFLAG, POS_TOTALSIZE, SIZE_MAGIC, STOREHOST_V6_FLAG,
    TRANSACTION_PREPARED_TYPE, check_record, decode_properties, decode_record, encode_properties, encode_record,
    pack_host,
)
from smartgo.store.record_columns import (
    RecordColumns, distinct_spans, hosts, msg_ids, properties, read_records, topics,
)

BORN = pack_host("10.1.2.3", 4567)
STORE = pack_host("127.0.0.1", 10911)
V6_BORN = bytes.fromhex("20010db8000000000000000000000001") + INT32.pack(5555)  # [2001:db8::1]:5555
V6_STORE = bytes(15) + b"\x01" + INT32.pack(10911)  # [::1]:10911
STORE_TS = 1_795_000_000_000


def record(topic: str = "TopicA", body: bytes = b"body", props: bytes | dict = b"", *, queue_id: int = 0,
           v6_born: bool = False, v6_store: bool = False, **fields) -> bytes:
    """A stamped record (PHYSICALOFFSET is set by layout()); IPv6 hosts spliced in by hand,
    as a Java broker would write them."""
    raw = encode_record(topic, queue_id, body, encode_properties(props) if isinstance(props, dict) else props,
                        born_host=BORN, store_host=STORE, born_timestamp=STORE_TS - 5,
                        store_timestamp=fields.pop("store_timestamp", STORE_TS), queue_offset=7, **fields)
    out = bytearray(raw)
    sys_flag = INT32.unpack_from(out, POS_SYSFLAG)[0]
    if v6_store:  # the later field first, so the born host's position still holds
        out[POS_STOREHOST:POS_STOREHOST + 8] = V6_STORE
        sys_flag |= STOREHOST_V6_FLAG
    if v6_born:
        out[48:56] = V6_BORN
        sys_flag |= BORNHOST_V6_FLAG
    INT32.pack_into(out, POS_SYSFLAG, sys_flag)
    INT32.pack_into(out, POS_TOTALSIZE, len(out))
    return bytes(out)


def layout(records: list[bytes], base: int = 0, tail: bytes = b"") -> tuple[np.ndarray, list[int]]:
    """The records one after the other as a file at physical offset base, each carrying its
    own PHYSICALOFFSET, then tail; and where each record starts."""
    buf = bytearray()
    positions = []
    for raw in records:
        positions.append(len(buf))
        buf += raw
        INT64.pack_into(buf, positions[-1] + POS_PHYSICALOFFSET, base + positions[-1])
    return np.frombuffer(bytes(buf + tail), np.uint8), positions


def with_invalid_topic_byte() -> bytes:
    raw = bytearray(record("TopicZ", b"xyz"))
    raw[raw.index(b"TopicZ") + 5] = 0xFF  # TOPIC is not covered by the CRC: decoded with "replace"
    return bytes(raw)


VARIED = [
    record("TopicA", b"hello", {"TAGS": "t", "KEYS": "k1 k2", "UNIQ_KEY": "0A0B0C"}),
    record("TopicB", b"", b"", queue_id=3),  # empty body and properties
    record("TopicA", zlib.compress(b"z" * 500), {"TAGS": "zip"}, sys_flag=COMPRESSED_FLAG | MULTI_TAGS_FLAG),
    record("TopicC", b"tx", {"TRAN_MSG": "true"}, sys_flag=TRANSACTION_PREPARED_TYPE, prepared_tx_offset=77,
           reconsume_times=3, flag=-5),
    record("TopicV6", b"born6", {"KEYS": "a"}, v6_born=True),
    record("TopicV6", b"store6", {"TAGS": "s"}, v6_store=True),
    record("TopicV6", b"both6", {"TAGS": "b", "UNIQ_KEY": "U"}, v6_born=True, v6_store=True),
    record("TopicP", b"1", b"TAGS\x01a\x02TAGS\x01b"),  # repeated name: the last value wins
    record("TopicP", b"2", b"\x02\x02TAGS\x01x\x02"),  # empty segments, trailing separator
    record("TopicP", b"3", b"\x01v\x02k\x01\x02ab\x02KEYS\x01 a  b "),  # empty name, empty value, no \x01
    record("TopicP", b"4", b"K\x01a\x01b"),  # a value holding \x01
    record("TopicP", b"5", "名字\x01值\x02TAGS\x01标签".encode()),  # valid non-ASCII UTF-8
    record("TopicP", b"6", b"TAGS\x01\xff\xfe\x02KEYS\x01\xc3"),  # invalid UTF-8: replaced
    record("TopicP", b"7", b"ABCDEFGH_X_IJKLMNOP\x011\x02ABCDEFGH_Y_IJKLMNOP\x012"),  # alike long names
    record("TopicP", b"8", b"TAGS\x01a\x02TAGS\x01"),  # an empty later value does not erase
    record("TopicP", b"9", encode_properties({f"name{i}": f"v{i}" for i in range(20)}) + b"\x02name3\x01last"),
    record("TopicP", b"10", b"N" * 300 + b"\x01long name"),
    record("TopicBig", bytes(range(256)) * 300, {"KEYS": "big"}),
    with_invalid_topic_byte(),
]


def as_rows(u8: np.ndarray, cols: RecordColumns) -> list[dict]:
    """The columns as one dict per record, in decode_record's terms."""
    names, topic_index = topics(u8, cols)
    born, born_index = hosts(u8, cols.born_host_at, cols.sys_flag, BORNHOST_V6_FLAG)
    store, store_index = hosts(u8, cols.store_host_at, cols.sys_flag, STOREHOST_V6_FLAG)
    text, id_offsets = msg_ids(u8, cols)
    props = properties(u8, cols)

    def span(buf, at, length) -> bytes:
        return buf[at:at + length].tobytes()

    rows = []
    for i in range(len(cols.position)):
        entries = range(props.offsets[i], props.offsets[i + 1])
        rows.append({
            "topic": names[topic_index[i]], "queue_id": cols.queue_id[i], "queue_offset": cols.queue_offset[i],
            "commit_log_offset": cols.commit_log_offset[i], "sys_flag": cols.sys_flag[i], "flag": cols.flag[i],
            "born_timestamp": cols.born_timestamp[i], "born_host": born[born_index[i]],
            "store_timestamp": cols.store_timestamp[i], "store_host": store[store_index[i]],
            "reconsume_times": cols.reconsume_times[i],
            "prepared_transaction_offset": cols.prepared_transaction_offset[i],
            "body": span(u8, cols.body_at[i], cols.body_len[i]), "body_crc": cols.body_crc[i],
            "store_size": cols.size[i], "msg_id": span(text, id_offsets[i], id_offsets[i + 1] - id_offsets[i]).decode(),
            "properties": [(span(props.buf, props.key_at[e], props.key_len[e]).decode(),
                            span(props.buf, props.value_at[e], props.value_len[e]).decode()) for e in entries],
        })
    return rows


def decoded(u8: np.ndarray, positions: list[int]) -> list[dict]:
    rows = []
    for pos in positions:
        m = decode_record(u8, pos, check_crc=True)
        rows.append({
            "topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
            "commit_log_offset": m.commit_log_offset, "sys_flag": m.sys_flag, "flag": m.flag,
            "born_timestamp": m.born_timestamp, "born_host": m.born_host, "store_timestamp": m.store_timestamp,
            "store_host": m.store_host, "reconsume_times": m.reconsume_times,
            "prepared_transaction_offset": m.prepared_transaction_offset, "body": m.body, "body_crc": m.body_crc,
            "store_size": m.store_size, "msg_id": m.msg_id, "properties": list(m.properties.items()),
        })
    return rows


def read_all(u8: np.ndarray, base: int = 0, **limits) -> tuple[RecordColumns, int, bool, int]:
    """Every record, in as many calls as the limits take: (columns, end, ended, calls)."""
    parts, pos, calls = [], 0, 0
    while True:
        got = read_records(u8, pos, len(u8), base, **limits)
        parts.append(got.columns)
        calls += 1
        if got.ended or got.end >= len(u8):
            return RecordColumns(*(np.concatenate(c) for c in zip(*parts))), got.end, got.ended, calls
        pos = got.end


@pytest.mark.parametrize("limits, calls", [({}, 1), ({"max_records": 1}, len(VARIED)), ({"max_records": 4}, 5),
                                           ({"max_bytes": 1000}, 4)])
def test_every_field_equals_decode_record(limits, calls):
    u8, positions = layout(VARIED, base=3 << 30)
    cols, end, ended, made = read_all(u8, 3 << 30, **limits)
    assert cols.position.tolist() == positions and end == len(u8) and not ended and made == calls
    got, want = as_rows(u8, cols), decoded(u8, positions)
    for g, w in zip(got, want, strict=True):
        assert g == w
    assert want[1]["body"] == b"" and want[1]["properties"] == []
    assert want[6]["born_host"] == ("2001:db8::1", 5555) and want[6]["store_host"] == ("::1", 10911)
    assert len(want[6]["msg_id"]) == 56 and want[-1]["topic"] == "Topic\ufffd"
    assert dict(want[7]["properties"]) == {"TAGS": "b"} and dict(want[14]["properties"]) == {"TAGS": "a"}
    assert dict(want[12]["properties"]) == {"TAGS": "\ufffd\ufffd", "KEYS": "\ufffd"}


def test_columns_match_the_record_layout():
    u8, positions = layout(VARIED)
    cols = read_records(u8, 0, len(u8)).columns
    for i, pos in enumerate(positions):
        end = pos + int(cols.size[i])
        assert check_record(u8.data, pos, len(u8), pos) == cols.size[i] and cols.props_end[i] == end
        assert u8[cols.topic_at[i] - 1] == cols.topic_len[i]
        assert cols.props_at[i] == cols.topic_at[i] + cols.topic_len[i] + 2
        assert decode_properties(u8[cols.props_at[i]:end]) == decode_record(u8, pos).properties


def test_find_gives_each_records_entry():
    u8, _ = layout(VARIED)
    cols = read_records(u8, 0, len(u8)).columns
    props = properties(u8, cols)
    tags, uniq, long_name = props.find(b"TAGS", b"UNIQ_KEY", b"ABCDEFGH_Y_IJKLMNOP")

    def value(entry: int) -> str | None:
        if entry < 0:
            return None
        return props.buf[props.value_at[entry]:props.value_at[entry] + props.value_len[entry]].tobytes().decode()

    want = [decode_record(u8, int(p)).properties for p in cols.position]
    assert [value(e) for e in tags] == [p.get("TAGS") for p in want]
    assert [value(e) for e in uniq] == [p.get("UNIQ_KEY") for p in want]
    assert [value(e) for e in long_name] == [p.get("ABCDEFGH_Y_IJKLMNOP") for p in want]
    assert value(long_name[13]) == "2"


PROPERTY_PIECES = st.sampled_from([b"a", b"b", b"TAGS", b"KEYS", b"\x01", b"\x02", b" ", "é".encode(), b"\xff",
                                   b"\xe4\xb8", b"ABCDEFGH_long_name"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(PROPERTY_PIECES, max_size=24).map(b"".join), min_size=1, max_size=12),
       st.integers(0, 3))
def test_properties_are_decode_properties(raws, long_row):
    """Any properties bytes, in rows of alike or very different lengths (the two ways the
    properties are gathered), parse as decode_properties parses them, order included."""
    if long_row < len(raws):
        raws[long_row] += b"\x02X\x01" + b"y" * 3000
    u8, positions = layout([record("T", b"", raw) for raw in raws])
    cols = read_records(u8, 0, len(u8)).columns
    props = properties(u8, cols)
    for i, raw in enumerate(raws):
        entries = range(props.offsets[i], props.offsets[i + 1])
        got = [(props.buf[props.key_at[e]:props.key_at[e] + props.key_len[e]].tobytes().decode(),
                props.buf[props.value_at[e]:props.value_at[e] + props.value_len[e]].tobytes().decode())
               for e in entries]
        assert got == list(decode_properties(raw).items())


def good_records(n: int = 5) -> list[bytes]:
    return [record("TopicA", bytes([65 + i]) * (10 + i), {"KEYS": f"k{i}"}) for i in range(n)]


def torn(u8: np.ndarray, positions: list[int]) -> np.ndarray:
    return u8[:positions[-1] + 40]  # the last record is cut in its header


def blank(u8: np.ndarray, positions: list[int]) -> np.ndarray:
    end = bytearray(u8[:positions[-1]].tobytes())
    filler = SIZE_MAGIC.pack(len(u8) - len(end), BLANK_MAGIC)
    return np.frombuffer(bytes(end + filler + bytes(len(u8) - len(end) - 8)), np.uint8)


def garbage(u8: np.ndarray, positions: list[int]) -> np.ndarray:
    return np.frombuffer(u8[:positions[-1]].tobytes() + os.urandom(len(u8) - positions[-1]), np.uint8)


def corrupt_crc(u8: np.ndarray, positions: list[int]) -> np.ndarray:
    out = bytearray(u8.tobytes())
    out[positions[-1] + HEADER_V4_SIZE + 2] ^= 0x20  # a body byte
    return np.frombuffer(bytes(out), np.uint8)


def unstamped(u8: np.ndarray, positions: list[int]) -> np.ndarray:
    out = bytearray(u8.tobytes())
    INT64.pack_into(out, positions[-1] + POS_STORETIMESTAMP, 0)
    return np.frombuffer(bytes(out), np.uint8)


def wrong_offset(u8: np.ndarray, positions: list[int]) -> np.ndarray:
    out = bytearray(u8.tobytes())
    INT64.pack_into(out, positions[-1] + POS_PHYSICALOFFSET, positions[0])  # a copy of another record
    return np.frombuffer(bytes(out), np.uint8)


def zeros(u8: np.ndarray, positions: list[int]) -> np.ndarray:
    return np.frombuffer(u8[:positions[-1]].tobytes() + bytes(len(u8) - positions[-1]), np.uint8)


def bad_body_length(u8: np.ndarray, positions: list[int]) -> np.ndarray:
    out = bytearray(u8.tobytes())
    INT32.pack_into(out, positions[-1] + 84, 10_000)  # BODYLEN past the record
    return np.frombuffer(bytes(out), np.uint8)


@pytest.mark.parametrize("spoil", [torn, blank, garbage, corrupt_crc, unstamped, wrong_offset, zeros,
                                   bad_body_length])
@pytest.mark.parametrize("limits", [{}, {"max_records": 2}])
def test_the_data_ends_before_the_first_incomplete_record(spoil, limits):
    u8, positions = layout(good_records(), tail=bytes(600))
    spoiled = spoil(u8, positions)
    cols, end, ended, _ = read_all(spoiled, **limits)
    assert cols.position.tolist() == positions[:-1]
    assert ended and end == positions[-1]
    assert [check_record(spoiled.data, p, len(spoiled), p) > 0 for p in positions] == [True] * 4 + [
        spoil is unstamped]  # the scalar check agrees (it does not look at the store time)


def test_a_record_that_starts_before_stop_is_read_whole():
    u8, positions = layout(good_records())
    got = read_records(u8, 0, positions[2] + 1)
    assert got.columns.position.tolist() == positions[:3] and got.end == positions[3] and not got.ended
    rest = read_records(u8, got.end, len(u8))
    assert rest.columns.position.tolist() == positions[3:] and rest.end == len(u8) and not rest.ended
    assert len(read_records(u8, positions[1], positions[1]).columns.position) == 0


def test_short_and_empty_files():
    for size in (0, 10, 90):
        got = read_records(np.zeros(size, np.uint8), 0, size)
        assert len(got.columns.position) == 0 and (got.ended or size == 0)
    assert properties(np.zeros(0, np.uint8), read_records(np.zeros(0, np.uint8), 0, 0).columns).offsets.tolist() \
        == [0]


def test_distinct_spans():
    data = np.frombuffer(b"abcabxab\x00abc", np.uint8)
    at = np.array([0, 3, 6, 0, 9, 8, 5], np.int64)
    length = np.array([3, 2, 2, 2, 3, 1, 0], np.int64)
    values, index = distinct_spans(data, at, length)
    assert [values[i] for i in index] == [b"abc", b"ab", b"ab", b"ab", b"abc", b"\x00", b""]
    assert len(values) == 4


def test_ids_of_ipv6_store_hosts_are_56_characters():
    u8, positions = layout([record(v6_store=True), record(), record(v6_store=True, v6_born=True)])
    text, offsets = msg_ids(u8, read_records(u8, 0, len(u8)).columns)
    assert np.diff(offsets).tolist() == [56, 32, 56]
    assert [text[offsets[i]:offsets[i + 1]].tobytes().decode() for i in range(3)] == \
        [decode_record(u8, p).msg_id for p in positions]
