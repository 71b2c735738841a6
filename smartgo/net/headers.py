"""Header codecs: JSON (type 0), ROCKETMQ binary (type 1) and SmartGo's msgpack (type 2).

Pure functions over bytes. Decoders trust nothing: every field is type-checked and every length is
bounded by the header, and any failure is a HeaderError (which closes the connection, as Netty's
decoder does in RocketMQ).

JSON output is what fastjson writes for RemotingCommand: compact, fields in alphabetical order,
remark and extFields left out when null, extFields values always strings (the Go client decodes
them into map[string]string). JSON input also takes numbers and booleans as extFields values
(ali-ons sends them raw) and turns them into the strings Java's toString() would give.
"""

from __future__ import annotations

import json
import json.scanner
import struct
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _quote

import msgpack

from smartgo.net.codes import LanguageCode, SerializeType
from smartgo.net.command import Buffer, RemotingCommand
from smartgo.net.errors import HeaderError

#: What JSON headers write for a language code, and read back.
LANGUAGE_NAMES = {int(c): c.name for c in LanguageCode}
LANGUAGE_BY_NAME = {c.name: int(c) for c in LanguageCode}
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1


def _java_text(value: object) -> str:
    """What Java's toString() gives for a header value (booleans are lower case)."""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


_DECODED_SCALARS = (str, int, float, bool, dict, list)


def _normalize_ext(ext: object, check_keys: bool) -> dict[str, str] | None:
    """Validate a decoded extFields map; returns it unchanged in the common all-strings case.
    (JSON object keys are always strings, so only msgpack needs check_keys.)"""
    if ext is None:
        return None
    if type(ext) is not dict:
        raise HeaderError(f"extFields must be an object, got {type(ext).__name__}")
    try:
        "".join(ext.values())  # C-speed "every value is a str"
        if check_keys:
            "".join(ext)
        return ext
    except TypeError:
        pass
    out = {}
    for key, value in ext.items():
        if type(key) is not str:
            raise HeaderError(f"extFields key {key!r} is not a string")
        if value is None:  # fastjson drops null fields
            continue
        if type(value) not in _DECODED_SCALARS:
            raise HeaderError(f"extFields value of {key!r} has unsupported type {type(value).__name__}")
        out[key] = _java_text(value)
    return out


def _int32(name: str, value: object) -> int:
    if type(value) is not int or not _INT32_MIN <= value <= _INT32_MAX:
        raise HeaderError(f"header field {name} must be a 32-bit integer, got {value!r}")
    return value


def _language(value: object) -> int:
    if type(value) is str:
        return LANGUAGE_BY_NAME.get(value, LanguageCode.OTHER)
    if type(value) is int:
        return value
    raise HeaderError(f"header field language must be a name or a number, got {value!r}")


def _make_command(code: object, language: object, version: object, opaque: object, flag: object,
                  remark: object, ext: object, serialize_type: int) -> RemotingCommand:
    if not (type(code) is type(version) is type(opaque) is type(flag) is int
            and _INT32_MIN <= min(code, version, opaque, flag)
            and max(code, version, opaque, flag) <= _INT32_MAX):
        for name, value in (("code", code), ("version", version), ("opaque", opaque), ("flag", flag)):
            _int32(name, value)
    if remark is not None and type(remark) is not str:
        raise HeaderError(f"header field remark must be a string, got {type(remark).__name__}")
    lang = language if type(language) is int else _language(language)
    return RemotingCommand(code, lang,  # type: ignore[arg-type]  # ints: checked above
                           version, opaque, flag, remark,  # type: ignore[arg-type]  # ints and str: checked above
                           _normalize_ext(ext, serialize_type == SerializeType.MSGPACK), None, serialize_type)


# -- JSON (type 0) ---------------------------------------------------------------------------------

def _json_ext(ext: dict) -> str:
    try:
        return ",".join([_quote(k) + ":" + _quote(v) for k, v in ext.items()])
    except TypeError:  # a non-string value: write what Java's toString() would
        return ",".join([_quote(str(k)) + ":" + _quote(_java_text(v))
                         for k, v in ext.items() if v is not None])


def encode_json_header(cmd: RemotingCommand, extra_flags: int = 0) -> bytes:
    ext = cmd.ext_fields
    remark = cmd.remark
    return ('{"code":%d%s,"flag":%d,"language":"%s","opaque":%d%s,'
            '"serializeTypeCurrentRPC":"JSON","version":%d}' % (
                cmd.code,
                ',"extFields":{' + _json_ext(ext) + "}" if ext is not None else "",
                cmd.flag | extra_flags,
                LANGUAGE_NAMES.get(cmd.language, "OTHER"),
                cmd.opaque,
                ',"remark":' + _quote(remark) if remark is not None else "",
                cmd.version)).encode("ascii")


_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed: context type


def decode_json_header(data: Buffer) -> RemotingCommand:
    try:
        text = str(data, "utf-8")
        # The scanner alone is 40 % cheaper than json.loads; fall back to json.loads for anything
        # unusual (surrounding whitespace, trailing data) so that errors read the same.
        try:
            obj, end = _scan_json(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):
            obj = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise HeaderError(f"undecodable JSON header: {exc}") from None
    if type(obj) is not dict:
        raise HeaderError(f"JSON header is not an object: {type(obj).__name__}")
    get = obj.get
    return _make_command(get("code"), get("language", "JAVA"), get("version", 0), get("opaque", 0),
                         get("flag", 0), get("remark"), get("extFields"), SerializeType.JSON)


# -- ROCKETMQ binary (type 1) ----------------------------------------------------------------------

_BIN_FIXED = struct.Struct(">hbhiii")   # code, language, version, opaque, flag, remark length
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


def encode_binary_header(cmd: RemotingCommand, extra_flags: int = 0) -> bytes:
    remark = cmd.remark.encode("utf-8") if cmd.remark else b""
    parts: list[bytes] = []
    for key, value in (cmd.ext_fields or {}).items():
        if value is None:
            continue
        kb = key.encode("utf-8")
        vb = (value if type(value) is str else _java_text(value)).encode("utf-8")
        parts += (_I16.pack(len(kb)), kb, _I32.pack(len(vb)), vb)
    ext = b"".join(parts)
    return b"".join((_BIN_FIXED.pack(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag | extra_flags,
                                     len(remark)), remark, _I32.pack(len(ext)), ext))


def _bad_length(what: str, size: int, limit: int) -> HeaderError:
    return HeaderError(f"ROCKETMQ header {what} length {size} exceeds the header ({limit} bytes)")


def decode_binary_header(data: Buffer) -> RemotingCommand:
    data = bytes(data)
    size = len(data)
    if size < _BIN_FIXED.size + 4:
        raise HeaderError(f"ROCKETMQ header too short: {size} bytes")
    code, language, version, opaque, flag, remark_len = _BIN_FIXED.unpack_from(data)
    pos = _BIN_FIXED.size
    if remark_len < 0 or pos + remark_len + 4 > size:
        raise _bad_length("remark", remark_len, size)
    try:
        remark = data[pos:pos + remark_len].decode("utf-8") if remark_len else None
        pos += remark_len
        (ext_len,) = _I32.unpack_from(data, pos)
        pos += 4
        end = pos + ext_len
        if ext_len < 0 or end > size:
            raise _bad_length("extFields", ext_len, size)
        ext: dict[str, str] | None = {} if ext_len else None
        unpack_short, unpack_int = _I16.unpack_from, _I32.unpack_from
        while pos < end:
            if pos + 2 > end:
                raise HeaderError("ROCKETMQ header extFields truncated in a key length")
            (key_len,) = unpack_short(data, pos)
            key_end = pos + 2 + key_len
            if key_len < 0 or key_end + 4 > end:
                raise _bad_length("extFields key", key_len, size)
            (value_len,) = unpack_int(data, key_end)
            value_end = key_end + 4 + value_len
            if value_len < 0 or value_end > end:
                raise _bad_length("extFields value", value_len, size)
            key = data[pos + 2:key_end].decode("utf-8")
            ext[key] = data[key_end + 4:value_end].decode("utf-8")  # type: ignore[index]  # a dict: ext_len > 0
            pos = value_end
    except UnicodeDecodeError as exc:
        raise HeaderError(f"ROCKETMQ header has text that is not UTF-8: {exc}") from None
    return RemotingCommand(code, language, version, opaque, flag, remark, ext, None, SerializeType.ROCKETMQ)


# -- msgpack (type 2, SmartGo only) ----------------------------------------------------------------

_pack = msgpack.Packer(use_bin_type=True).pack


def encode_msgpack_header(cmd: RemotingCommand, extra_flags: int = 0) -> bytes:
    return _pack((cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag | extra_flags,
                  cmd.remark, cmd.ext_fields))


def decode_msgpack_header(data: Buffer) -> RemotingCommand:
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for malformed input
        raise HeaderError(f"undecodable msgpack header: {type(exc).__name__}: {exc}") from None
    if type(obj) is not list or len(obj) != 7:
        raise HeaderError("msgpack header is not a 7-item array")
    return _make_command(*obj, SerializeType.MSGPACK)  # type: ignore[call-arg]  # obj: 7 items, checked above


_ENCODERS: dict[int, Callable[[RemotingCommand, int], bytes]] = {
    SerializeType.JSON: encode_json_header, SerializeType.ROCKETMQ: encode_binary_header,
    SerializeType.MSGPACK: encode_msgpack_header}
DECODERS: dict[int, Callable[[Buffer], RemotingCommand]] = {
    SerializeType.JSON: decode_json_header, SerializeType.ROCKETMQ: decode_binary_header,
    SerializeType.MSGPACK: decode_msgpack_header}


def encode_header(cmd: RemotingCommand, extra_flags: int = 0) -> bytes:
    """The header bytes of cmd in its own serialize type; extra_flags are OR-ed into flag."""
    try:
        encoder = _ENCODERS[cmd.serialize_type]
    except KeyError:
        raise ValueError(f"unknown serialize type {cmd.serialize_type}") from None
    return encoder(cmd, extra_flags)


def decode_header(serialize_type: int, data: Buffer) -> RemotingCommand:
    try:
        decoder = DECODERS[serialize_type]
    except KeyError:
        raise HeaderError(f"unknown serialize type {serialize_type}") from None
    return decoder(data)
