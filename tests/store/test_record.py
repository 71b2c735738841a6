"""Record codec: golden bytes, round trips, properties, ids, batch bodies, limits, bad input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartgo.store.errors import CorruptRecordError, InvalidMessageIdError, MessageIllegalError
from smartgo.store import java_hash as java_hash_module
from smartgo.store.java_hash import index_hashes, index_hashes_vectorized, java_hash, positive_index_hash, tags_code
from smartgo.store.record import (
    BLANK_MAGIC, FIXED_SIZE, MESSAGE_MAGIC, POS_PHYSICALOFFSET, POS_QUEUEOFFSET, POS_STORETIMESTAMP, BatchItem,
    check_record, create_offset_msg_id, decode_batch_body, decode_properties, decode_record, decode_records,
    encode_batch_body, encode_properties, encode_record, pack_host, parse_offset_msg_id,
    peek_dispatch, schedule_tags_code,
)

# One record worked out by hand from the layout (facts E), field by field, big-endian.
GOLDEN = b"".join([
    bytes.fromhex("00000064"),  # TOTALSIZE = 91 + body 2 + topic 1 + properties 6 = 100
    bytes.fromhex("DAA320A7"),  # MAGICCODE (Java's value)
    bytes.fromhex("58932AAC"),  # BODYCRC = CRC32("hi") 0xD8932AAC & 0x7FFFFFFF
    bytes.fromhex("00000001"),  # QUEUEID 1
    bytes.fromhex("00000007"),  # FLAG 7
    bytes.fromhex("0000000000000005"),  # QUEUEOFFSET 5
    bytes.fromhex("0000000000000010"),  # PHYSICALOFFSET 16
    bytes.fromhex("00000000"),  # SYSFLAG 0
    bytes.fromhex("0102030405060708"),  # BORNTIMESTAMP
    bytes.fromhex("7F000001" "00002A9F"),  # BORNHOST 127.0.0.1:10911
    bytes.fromhex("1122334455667788"),  # STORETIMESTAMP
    bytes.fromhex("0A000002" "00002A9F"),  # STOREHOST 10.0.0.2:10911
    bytes.fromhex("00000002"),  # RECONSUMETIMES 2
    bytes.fromhex("0000000000000000"),  # PREPARED TX OFFSET
    bytes.fromhex("00000002") + b"hi",  # BODY
    bytes.fromhex("01") + b"T",  # TOPIC
    bytes.fromhex("0006") + b"TAGS\x01a",  # PROPERTIES
])


def golden_args():
    return dict(flag=7, born_timestamp=0x0102030405060708, born_host=pack_host("127.0.0.1", 10911),
                store_host=pack_host("10.0.0.2", 10911), reconsume_times=2)


def test_golden_bytes_by_hand():
    assert len(GOLDEN) == 100
    encoded = encode_record("T", 1, b"hi", b"TAGS\x01a", queue_offset=5, physical_offset=16,
                            store_timestamp=0x1122334455667788, **golden_args())
    assert encoded == GOLDEN


def test_encode_leaves_writer_fields_zero_and_offsets_are_exported():
    encoded = bytearray(encode_record("T", 1, b"hi", b"TAGS\x01a", **golden_args()))
    assert encoded[POS_QUEUEOFFSET:POS_QUEUEOFFSET + 8] == bytes(8)
    assert encoded[POS_PHYSICALOFFSET:POS_PHYSICALOFFSET + 8] == bytes(8)
    assert encoded[POS_STORETIMESTAMP:POS_STORETIMESTAMP + 8] == bytes(8)
    struct.pack_into(">qq", encoded, POS_QUEUEOFFSET, 5, 16)
    struct.pack_into(">q", encoded, POS_STORETIMESTAMP, 0x1122334455667788)
    assert bytes(encoded) == GOLDEN


def test_decode_golden():
    m = decode_record(GOLDEN, check_crc=True)
    assert (m.topic, m.queue_id, m.queue_offset, m.commit_log_offset, m.flag) == ("T", 1, 5, 16, 7)
    assert m.born_host == ("127.0.0.1", 10911) and m.store_host == ("10.0.0.2", 10911)
    assert m.born_timestamp == 0x0102030405060708 and m.store_timestamp == 0x1122334455667788
    assert m.reconsume_times == 2 and m.prepared_transaction_offset == 0
    assert m.body == b"hi" and m.properties == {"TAGS": "a"} and m.tags == "a"
    assert m.store_size == 100 and m.body_crc == 0x58932AAC
    assert m.msg_id == "0A00000200002A9F0000000000000010"


def test_constants_are_javas():
    assert MESSAGE_MAGIC == -626843481 and BLANK_MAGIC == -875286124 and FIXED_SIZE == 91


@settings(max_examples=60, deadline=None)
@given(topic=st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True),
       queue_id=st.integers(0, 2**31 - 1), body=st.binary(max_size=600),
       props=st.dictionaries(st.text("abcXYZ_", min_size=1, max_size=8),
                             st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                                     min_size=1, max_size=20), max_size=5),
       flag=st.integers(-2**31, 2**31 - 1), sys_flag=st.sampled_from([0, 1, 2, 4, 8, 12]))
def test_round_trip(topic, queue_id, body, props, flag, sys_flag):
    raw = encode_record(topic, queue_id, body, encode_properties(props), flag=flag, sys_flag=sys_flag,
                        born_timestamp=123, born_host=pack_host("1.2.3.4", 5), store_host=pack_host("5.6.7.8", 9))
    m = decode_record(raw, check_crc=True)
    assert (m.topic, m.queue_id, m.body, m.properties, m.flag, m.sys_flag) == (topic, queue_id, body, props, flag,
                                                                              sys_flag)
    assert m.store_size == len(raw) == check_record(memoryview(raw), 0, len(raw))
    info = peek_dispatch(raw)
    assert info.topic == topic.encode() and info.queue_id == queue_id and info.size == len(raw)
    assert info.tags_code == tags_code(props.get("TAGS"))
    assert info.uniq_key == props.get("UNIQ_KEY", "").encode() and info.keys == props.get("KEYS", "").encode()


def test_concatenated_records_decode_as_a_pull_body():
    recs = [encode_record("TopicA", i, b"m%d" % i, encode_properties({"UNIQ_KEY": f"U{i}"})) for i in range(5)]
    msgs = decode_records(b"".join(recs), check_crc=True)
    assert [m.body for m in msgs] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert [m.uniq_key for m in msgs] == ["U0", "U1", "U2", "U3", "U4"]


def test_properties_codec():
    assert encode_properties({"A": "1", "B": "2"}) == b"A\x011\x02B\x012"
    assert decode_properties(b"A\x011\x02B\x012\x02") == {"A": "1", "B": "2"}  # trailing \x02 (ali-ons)
    assert decode_properties("A\x011\x02\x02x\x02K\x01\x02\x01v\x02KEYS\x01k1 k2") == {"A": "1", "KEYS": "k1 k2"}
    assert decode_properties(b"") == {}


@pytest.fixture(params=["c", "python"])
def hash_impl(request, monkeypatch):
    """The hash tests on the C accelerator (smartgo/store/_java_hash.c) and on the Python code."""
    if request.param == "python":
        monkeypatch.setattr(java_hash_module, "ascii_hash", None)
    else:
        assert java_hash_module._c is not None, "smartgo.store._java_hash was not built: see the pip install output"
        monkeypatch.setattr(java_hash_module, "ascii_hash", java_hash_module._c.ascii_hash)
    return request.param


def test_java_hash_vectors(hash_impl):
    assert java_hash("TagA") == 2598919
    assert java_hash("") == 0
    assert java_hash("hello") == 99162322
    assert java_hash("Aa") == java_hash("BB") == 2112  # the classic collision
    assert java_hash("héllo") == 99162322 + (ord("é") - ord("e")) * 31 ** 3
    assert java_hash("中文") == 20013 * 31 + 25991
    assert java_hash("😀") == 0xD83D * 31 + 0xDE00  # UTF-16 surrogate pair
    assert java_hash("polygenelubricants") == -2147483648  # Integer.MIN_VALUE
    assert java_hash(b"TagA") == java_hash("TagA") and java_hash("x" * 1000) == java_hash(b"x" * 1000)
    assert positive_index_hash(java_hash("polygenelubricants") & 0xFFFFFFFF) == 0
    assert positive_index_hash(-5 & 0xFFFFFFFF) == 5
    assert tags_code(None) == tags_code("") == 0 and tags_code("TagA") == 2598919


def _reference_hash(text: str) -> int:
    h = 0
    raw = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(raw), 2):
        h = (31 * h + int.from_bytes(raw[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=600))
def test_java_hash_matches_reference(text):
    assert java_hash(text) == _reference_hash(text)
    with_c = java_hash(text.encode("utf-8", "surrogatepass"))
    saved, java_hash_module.ascii_hash = java_hash_module.ascii_hash, None
    try:
        assert java_hash(text.encode("utf-8", "surrogatepass")) == with_c     # bytes: the same on both paths
    finally:
        java_hash_module.ascii_hash = saved


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, (1 << 32) - 1))
def test_c_ascii_hash_continues_a_prefix_exactly(data, seed):
    """(seed * 31**n + hash(data)) mod 2**32, the hash of prefix + data; None past ASCII."""
    ascii_hash = java_hash_module._c.ascii_hash
    expected = seed
    for b in data:
        expected = (expected * 31 + b) & 0xFFFFFFFF
    assert ascii_hash(data, seed) == (expected if data.isascii() else None)
    assert ascii_hash(bytearray(data)) == ascii_hash(memoryview(data)) == (
        java_hash_module._hash_units(data) if data.isascii() else None)


def test_c_ascii_hash_refuses_what_is_not_bytes():
    from array import array
    with pytest.raises(TypeError):
        java_hash_module._c.ascii_hash(array("H", [1, 2]))
    with pytest.raises(TypeError):
        java_hash_module._c.ascii_hash("text")


def test_vectorized_index_hashes_match_scalar(hash_impl):
    pytest.importorskip("numpy")
    topics = [b"Topic%d" % (i % 3) for i in range(301)]
    keys = [b"K" * (i % 40 + 1) + b"%d" % i for i in range(300)] + [b"polygenelubricants"[5:]]
    scalar = index_hashes(topics, keys, {})
    vector = index_hashes_vectorized(topics, keys, {})
    assert vector is not None and list(vector) == scalar
    assert scalar[0] == abs(java_hash("Topic0#K0"))
    assert index_hashes_vectorized([b"T"], ["é".encode()], {}) is None  # non-ASCII: scalar path
    assert index_hashes([b"T"], ["é".encode()], {}) == [abs(java_hash("T#é"))]


def test_offset_msg_id():
    host = pack_host("192.168.0.10", 10911)
    msg_id = create_offset_msg_id(host, 0x1234567890)
    assert msg_id == "C0A8000A00002A9F0000001234567890"
    assert parse_offset_msg_id(msg_id) == ("192.168.0.10", 10911, 0x1234567890)
    assert parse_offset_msg_id(msg_id.lower())[2] == 0x1234567890
    for bad in ("", "XYZ", "C0A8000A00002A9F00000012345678", "zz" * 16):
        with pytest.raises(InvalidMessageIdError):
            parse_offset_msg_id(bad)


def test_batch_body_round_trip_and_layout():
    items = [BatchItem(b"a", 1, b"UNIQ_KEY\x01u1"), BatchItem(b"", 0, b"")]
    body = encode_batch_body(items)
    # TOTALSIZE 22+1+11=34, MAGIC 0, CRC 0, FLAG 1, BODYLEN 1, body, PROPLEN 11, props
    assert body[:34] == bytes.fromhex("00000022" "00000000" "00000000" "00000001" "00000001") + b"a" + \
        bytes.fromhex("000B") + b"UNIQ_KEY\x01u1"
    assert decode_batch_body(body) == items
    for bad in (body[:-1], body + b"\x00", bytes.fromhex("00000010") + bytes(18)):
        with pytest.raises(CorruptRecordError):
            decode_batch_body(bad)


def test_limits_are_checked_before_encoding():
    with pytest.raises(MessageIllegalError, match="topic"):
        encode_record("a" * 128, 0, b"", b"")
    with pytest.raises(MessageIllegalError, match="topic"):
        encode_record("bad topic", 0, b"", b"")
    with pytest.raises(MessageIllegalError, match="topic"):
        encode_record("", 0, b"", b"")
    encode_record("%RETRY%g|x_-1" + "a" * 114, 0, b"", b"")  # 127 chars of the allowed set
    with pytest.raises(MessageIllegalError, match="properties"):
        encode_record("T", 0, b"", b"x" * 32768)
    encode_record("T", 0, b"", b"x" * 32767)
    with pytest.raises(MessageIllegalError, match="body"):
        encode_record("T", 0, b"x" * 11, b"", max_body=10)
    with pytest.raises(MessageIllegalError, match="host"):
        pack_host("::1", 1)


def test_schedule_topic_tags_code_is_delivery_time():
    levels = (1000, 5000, 10000)
    raw = encode_record("SCHEDULE_TOPIC_XXXX", 1, b"", encode_properties({"DELAY": "2", "TAGS": "x"}),
                        store_timestamp=1_000_000)
    assert peek_dispatch(raw, 0, levels).tags_code == 1_005_000
    assert peek_dispatch(raw).tags_code == tags_code("x")
    assert schedule_tags_code(b"99", 0, levels) == 10000  # level capped
    assert schedule_tags_code(b"x", 7, levels) == 7


@pytest.mark.parametrize("cut", [0, 1, 4, 50, 90, 99])
def test_truncated_record_raises_corrupt(cut):
    with pytest.raises(CorruptRecordError):
        decode_record(GOLDEN[:cut])


@pytest.mark.parametrize("pos,value", [(0, b"\x00\x00\x00\x05"), (0, b"\x7f\xff\xff\xff"), (4, b"\x00\x00\x00\x00"),
                                       (84, b"\x00\x00\x10\x00"), (84, b"\xff\xff\xff\xff"), (90, b"\x00"),
                                       (90, b"\x7f"), (92, b"\x7f\xff")])
def test_garbled_fields_raise_corrupt(pos, value):
    bad = bytearray(GOLDEN)
    bad[pos:pos + len(value)] = value
    with pytest.raises(CorruptRecordError):
        decode_record(bytes(bad))
    assert check_record(memoryview(bytes(bad)), 0, len(bad)) == 0


def test_crc_mismatch_detected_only_when_asked():
    bad = bytearray(GOLDEN)
    bad[88] ^= 0xFF  # first body byte
    assert decode_record(bytes(bad)).body != b"hi"
    with pytest.raises(CorruptRecordError, match="CRC"):
        decode_record(bytes(bad), check_crc=True)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 99), st.binary(min_size=1, max_size=8))
def test_decoder_never_leaks_other_errors(noise, pos, patch):
    """Random bytes and random patches of a good record: a MessageExt or CorruptRecordError."""
    bad = bytearray(GOLDEN)
    bad[pos:pos + len(patch)] = patch
    for data in (noise, bytes(bad), GOLDEN + noise):
        try:
            list(decode_records(data, check_crc=True))
        except CorruptRecordError:
            pass
        check_record(memoryview(data), 0, len(data))
