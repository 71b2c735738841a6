"""Java String.hashCode, bit-exact, fast enough for the dispatch hot path.

Tag codes (ConsumeQueue) and index keys must equal what a Java broker computes: the
polynomial sum of UTF-16 code units times powers of 31, modulo 2**32, read as a signed
int32. For ASCII the code units are the bytes, so the sum is one C-level
``sum(map(mul, data, powers))`` over precomputed powers instead of a Python loop.
"""

from __future__ import annotations

import functools
import operator
import sys
from array import array
from collections.abc import Sequence

from smartgo import accel
from smartgo.store.lazy_numpy import np as _np    # vectorised hashing of a dispatch round's tags and keys

_MASK = 0xFFFFFFFF
_CHUNK = 256
# _POWERS[k] = 31**k mod 2**32; _SUFFIX[n] = the powers a string of n units is weighted by.
_POWERS = [pow(31, k, 1 << 32) for k in range(_CHUNK + 1)]
_SUFFIX = [_POWERS[n - 1::-1] if n else [] for n in range(_CHUNK + 1)]
_mul = operator.mul

_c = accel.load("smartgo.store._java_hash")
#: (seed * 31**len(data) + hash(data)) mod 2**32 of ASCII bytes, None if not ASCII (_java_hash.c);
#: None when not built or turned off: the Python code below does it.
ascii_hash = _c.ascii_hash if _c is not None and accel.ENABLED else None


def accelerated() -> bool:
    return ascii_hash is not None


@functools.cache
def _np_tables() -> tuple[_np.ndarray, _np.ndarray, _np.ndarray]:
    """31**k, its inverses mod 2**32 and the column numbers, as arrays (built on first use)."""
    return (_np.array(_POWERS, dtype=_np.uint32),
            _np.array([pow(31, -k, 1 << 32) for k in range(_CHUNK + 1)], dtype=_np.uint32), _np.arange(_CHUNK))


def _hash_units(units: Sequence[int]) -> int:
    """Unsigned hash of a sequence of code units (bytes, array('H'), list of ints)."""
    n = len(units)
    if n <= _CHUNK:
        return sum(map(_mul, units, _SUFFIX[n])) & _MASK
    h = 0
    step = _POWERS[_CHUNK]
    for i in range(0, n - n % _CHUNK, _CHUNK):
        h = (h * step + sum(map(_mul, units[i:i + _CHUNK], _SUFFIX[_CHUNK]))) & _MASK
    rest = n % _CHUNK
    if rest:
        h = (h * _POWERS[rest] + sum(map(_mul, units[n - rest:], _SUFFIX[rest]))) & _MASK
    return h


def _utf16_units(text: str) -> array[int]:
    units = array("H", text.encode("utf-16-le", "surrogatepass"))
    if sys.byteorder == "big":
        units.byteswap()
    return units


def java_hash_u32(value: str | bytes | bytearray | memoryview) -> int:
    """Unsigned 32-bit Java hashCode of a str, or of UTF-8 bytes (decoded only if not ASCII)."""
    if isinstance(value, str):
        if not value.isascii():
            return _hash_units(_utf16_units(value))
        value = value.encode("ascii")
    if ascii_hash is not None:
        h = ascii_hash(value)
        if h is not None:
            return h
    elif value.isascii() if not isinstance(value, memoryview) else bytes(value).isascii():
        return _hash_units(value)
    return _hash_units(_utf16_units(bytes(value).decode("utf-8", "replace")))


def to_int32(h: int) -> int:
    return h - 0x100000000 if h & 0x80000000 else h


def java_hash(value: str | bytes | bytearray | memoryview) -> int:
    """Java ``String.hashCode()`` as a signed int32 (bytes are taken as UTF-8 text)."""
    return to_int32(java_hash_u32(value))


def prefix_hash(topic: bytes, cache: dict[bytes, int]) -> int:
    """Unsigned hash of ``topic#`` (cached: a store has few topics)."""
    h = cache.get(topic)
    if h is None:
        h = cache[topic] = java_hash_u32(topic + b"#")
    return h


def _prefixes(topics: list[bytes], cache: dict[bytes, int]) -> list[int]:
    """prefix_hash per topic."""
    cached = [cache.get(t) for t in topics]
    if None in cached:
        return [prefix_hash(t, cache) for t in topics]
    return cached  # type: ignore[return-value]  # no None left in it: checked just above


def index_hashes(topics: list[bytes], keys: list[bytes], prefix_cache: dict[bytes, int]) -> list[int]:
    """Positive index hash (IndexFile.indexKeyHashMethod) of each ``topic#key``."""
    out: list[int] = []
    append = out.append
    suffix = _SUFFIX
    powers = _POWERS
    mul = _mul
    fast = ascii_hash
    for topic, key, prefix in zip(topics, keys, _prefixes(topics, prefix_cache)):
        n = len(key)
        if fast is not None:
            h = fast(key, prefix)
            if h is None:
                h = java_hash_u32(topic + b"#" + key)
        elif n <= _CHUNK and key.isascii():
            h = (prefix * powers[n] + sum(map(mul, key, suffix[n]))) & _MASK
        else:
            h = java_hash_u32(topic + b"#" + key)
        if h & 0x80000000:
            h = 0 if h == 0x80000000 else 0x100000000 - h
        append(h)
    return out


def byte_rows(a: _np.ndarray, starts: _np.ndarray, width: int) -> _np.ndarray:
    """a[start:start + width] for each start as one (n, width) copy: fancy indexing of a
    strided window view copies rows without building an index per byte. Bytes outside a
    read as 0."""
    if len(starts) and int(starts.min()) >= 0 and int(starts.max()) + width <= len(a):
        return _np.ndarray((len(a) - width + 1, width), _np.uint8, a, strides=(1, 1))[starts]
    idx = _np.asarray(starts, _np.int64)[:, None] + _np.arange(width)
    outside = (idx < 0) | (idx >= len(a))
    rows = a.take(idx, mode="clip")
    rows[outside] = 0
    return rows


def span_hashes_u32(buf: _np.ndarray, starts: _np.ndarray,
                    lengths: _np.ndarray) -> tuple[_np.ndarray, _np.ndarray]:
    """Unsigned Java hashes of the spans buf[start:start + length] of a uint8 array, as a
    uint32 array, plus a mask of the spans left for java_hash_u32 (non-ASCII, or longer
    than _CHUNK bytes; their slot holds garbage). Empty spans hash to 0, whatever their start."""
    powers, inverse_powers, columns = _np_tables()
    lengths = _np.asarray(lengths, _np.int64)
    scalar = lengths > _CHUNK
    width = int(lengths.max(initial=0, where=~scalar))
    if width == 0:
        return _np.zeros(len(lengths), _np.uint32), scalar
    # Left-aligned rows, zero padded on the right: one weight row for all spans gives
    # hash * 31**padding, and 31 is odd, so multiplying by its inverse power undoes the
    # padding. uint32 arithmetic wraps modulo 2**32 exactly as Java's int does.
    uniform = bool((lengths == width).all())  # e.g. UNIQ_KEYs: no padding to mask or undo
    rows = byte_rows(buf, starts if uniform else _np.where(lengths > 0, starts, 0), width)
    if not uniform:
        rows[columns[:width] >= lengths[:, None]] = 0
    if rows.max(initial=0) >= 0x80:
        scalar = scalar | (rows >= 0x80).any(axis=1)
    padded = _np.einsum("ij,j->i", rows, powers[width - 1::-1], dtype=_np.uint32)
    if uniform:
        return padded, scalar
    return padded * inverse_powers[_np.clip(width - lengths, 0, _CHUNK)], scalar


def positive_index_hashes(h_u32: _np.ndarray) -> _np.ndarray:
    """positive_index_hash over a uint32 array, as int64."""
    signed = _np.abs(h_u32.view(_np.int32).astype(_np.int64))
    signed[signed == 0x80000000] = 0
    return signed


def index_hashes_vectorized(topics: list[bytes], keys: list[bytes],
                            prefix_cache: dict[bytes, int]) -> _np.ndarray | None:
    """index_hashes for a large batch with numpy (an int64 array), or None when numpy is
    missing or a key is not short ASCII (the caller falls back)."""
    if _np is None:
        return None
    lengths = _np.fromiter(map(len, keys), _np.int64, len(keys))
    starts = _np.cumsum(lengths) - lengths
    key_hash, scalar = span_hashes_u32(_np.frombuffer(b"".join(keys), _np.uint8), starts, lengths)
    if scalar.any():
        return None
    return positive_index_hashes(prefixed_hashes(_np.array(_prefixes(topics, prefix_cache), _np.uint32),
                                                 key_hash, lengths))


def prefixed_hashes(prefix_u32: _np.ndarray, key_u32: _np.ndarray, key_lengths: _np.ndarray) -> _np.ndarray:
    """Unsigned hash of prefix + key from the two parts' hashes (key: ASCII, <= _CHUNK bytes)."""
    return prefix_u32 * _np_tables()[0][_np.minimum(key_lengths, _CHUNK)] + key_u32


def positive_index_hash(h_u32: int) -> int:
    """IndexFile.indexKeyHashMethod: Math.abs(hashCode), with Integer.MIN_VALUE mapped to 0."""
    if h_u32 & 0x80000000:
        h_u32 = 0x100000000 - h_u32
        return 0 if h_u32 == 0x80000000 else h_u32
    return h_u32


TAGS_CODES: dict[object, int] = {}  # tags value -> code; read directly on hot paths
TAGS_CODES_MAX = 65536


def tags_code(tags: str | bytes | None) -> int:
    """ConsumeQueue tagsCode of a TAGS value: its Java hashCode (0 when empty or absent), cached."""
    if not tags:
        return 0
    code = TAGS_CODES.get(tags)
    if code is None:
        code = java_hash(tags)
        if len(TAGS_CODES) >= TAGS_CODES_MAX:
            TAGS_CODES.clear()
        TAGS_CODES[bytes(tags) if isinstance(tags, (bytearray, memoryview)) else tags] = code
    return code
