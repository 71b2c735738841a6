"""Java String.hashCode, bit-exact, fast enough for the dispatch hot path.

Tag codes (ConsumeQueue) and index keys must equal what a Java broker computes: the
polynomial sum of UTF-16 code units times powers of 31, modulo 2**32, read as a signed
int32. For ASCII the code units are the bytes, so the sum is one C-level
``sum(map(mul, data, powers))`` over precomputed powers instead of a Python loop.
"""

from __future__ import annotations

import operator
import sys
from array import array

_MASK = 0xFFFFFFFF
_CHUNK = 256
# _POWERS[k] = 31**k mod 2**32; _SUFFIX[n] = the powers a string of n units is weighted by.
_POWERS = [pow(31, k, 1 << 32) for k in range(_CHUNK + 1)]
_SUFFIX = [_POWERS[n - 1::-1] if n else [] for n in range(_CHUNK + 1)]
_mul = operator.mul

try:  # optional: vectorised hashing of a whole dispatch round's index keys
    import numpy as _np

    _NP_POWERS = _np.array(_POWERS, dtype=_np.uint32)
except ImportError:  # pragma: no cover - numpy is present wherever pandas is
    _np = None


def _hash_units(units) -> int:
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


def _utf16_units(text: str):
    units = array("H", text.encode("utf-16-le", "surrogatepass"))
    if sys.byteorder == "big":
        units.byteswap()
    return units


def java_hash_u32(value: str | bytes | bytearray | memoryview) -> int:
    """Unsigned 32-bit Java hashCode of a str, or of UTF-8 bytes (decoded only if not ASCII)."""
    if isinstance(value, str):
        if value.isascii():
            return _hash_units(value.encode("ascii"))
        return _hash_units(_utf16_units(value))
    if value.isascii() if not isinstance(value, memoryview) else bytes(value).isascii():
        return _hash_units(value)
    return _hash_units(_utf16_units(bytes(value).decode("utf-8", "replace")))


def to_int32(h: int) -> int:
    return h - 0x100000000 if h & 0x80000000 else h


def java_hash(value: str | bytes | bytearray | memoryview) -> int:
    """Java ``String.hashCode()`` as a signed int32 (bytes are taken as UTF-8 text)."""
    return to_int32(java_hash_u32(value))


def _prefixes(topics: list[bytes], cache: dict[bytes, int]) -> list[int]:
    """Hash of ``topic#`` per topic (cached: a store has few topics)."""
    prefixes = [cache.get(t) for t in topics]
    if None in prefixes:
        for t in set(topics) - cache.keys():
            cache[t] = java_hash_u32(t + b"#")
        prefixes = [cache[t] for t in topics]
    return prefixes


def index_hashes(topics: list[bytes], keys: list[bytes], prefix_cache: dict[bytes, int]) -> list[int]:
    """Positive index hash (IndexFile.indexKeyHashMethod) of each ``topic#key``."""
    out = []
    append = out.append
    suffix = _SUFFIX
    powers = _POWERS
    mul = _mul
    for topic, key, prefix in zip(topics, keys, _prefixes(topics, prefix_cache)):
        n = len(key)
        if n <= _CHUNK and key.isascii():
            h = (prefix * powers[n] + sum(map(mul, key, suffix[n]))) & _MASK
        else:
            h = java_hash_u32(topic + b"#" + key)
        if h & 0x80000000:
            h = 0 if h == 0x80000000 else 0x100000000 - h
        append(h)
    return out


def index_hashes_vectorized(topics: list[bytes], keys: list[bytes], prefix_cache: dict[bytes, int]):
    """index_hashes for a large batch with numpy (an int64 array), or None when numpy is
    missing or a key is not short ASCII (the caller falls back)."""
    if _np is None:
        return None
    lengths = list(map(len, keys))
    width = max(lengths)
    if width > _CHUNK or not b"".join(keys).isascii():
        return None
    # Left zero-padding leaves a Java hash unchanged, so all keys share one weight row;
    # uint32 arithmetic wraps modulo 2**32 exactly as Java's int does.
    matrix = _np.frombuffer(b"".join([k.rjust(width, b"\0") for k in keys]), _np.uint8).reshape(len(keys), width)
    key_hash = (matrix * _NP_POWERS[width - 1::-1]).sum(axis=1, dtype=_np.uint32)
    h = _np.array(_prefixes(topics, prefix_cache), _np.uint32) * _NP_POWERS[lengths] + key_hash
    signed = _np.abs(h.view(_np.int32).astype(_np.int64))
    signed[signed == 0x80000000] = 0
    return signed


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
