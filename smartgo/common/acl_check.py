"""RocketMQ 4.x plain ACL (the `acl` module's PlainAccessValidator, PlainPermissionManager,
Permission, RemoteAddressStrategyFactory, AclUtils and AclClientRPCHook), pure and dependency-light:
the nodes check requests with it (smartgo.common.acl_guard); the signature it checks is made by
smartgo.common.acl_sign, which clients load without this module.

What a request needs (4.9.x PlainAccessValidator.parse), by request code; a group is the resource
"%RETRY%<group>" and is checked against groupPerms / defaultGroupPerm, every other name against
topicPerms / defaultTopicPerm:

  SEND_MESSAGE (10)            ext "topic" PUB; a retry topic instead needs SUB of ext "group"
  SEND_MESSAGE_V2 (310)        ext "b" (topic) PUB; a retry topic instead needs SUB of ext "a"
  SEND_BATCH_MESSAGE (320)     as SEND_MESSAGE_V2 (5.x; 4.9.x checks nothing, see _needed)
  CONSUMER_SEND_MSG_BACK (36)  group of ext "group" SUB
  PULL_MESSAGE (11)            ext "topic" SUB, group of ext "consumerGroup" SUB
  QUERY_MESSAGE (12)           ext "topic" SUB
  HEART_BEAT (34)              every consumer group SUB, every subscribed topic SUB (from the body)
  UNREGISTER_CLIENT (35)       group of ext "consumerGroup" SUB
  GET_CONSUMER_LIST_BY_GROUP (38)  group of ext "consumerGroup" SUB
  UPDATE_CONSUMER_OFFSET (15)  group of ext "consumerGroup" SUB, ext "topic" SUB
  any other code               nothing (signature only); sixteen codes are admin-only (ADMIN_CODES)

A missing ext field adds no resource: 4.x reads the header classes with decodeCommandCustomHeader,
which logs and skips a missing or unparsable field instead of failing.

AclValidator.check runs 4.x's steps in 4.x's order (parse, then PlainPermissionManager.validate):
resources (a bad HEART_BEAT body fails here, even for a white-listed client), the global white
list, AccessKey present, AccessKey known, the account's white list, the signature, the message
trace topic exemption, the admin-only codes, then each resource's permission.

Departures from 4.9.x, each where 4.9.x misbehaves:
  * a bad permission string, a duplicate accessKey, a YAML number written so that Java would read
    another value than the text (octal 01234567, 1_000_000), a key that is a YAML float, boolean
    or date, and a whitelist pattern that 4.x accepts but can never match ("192.168.999.*") are
    refused at load (4.x: DENY, the first one wins, the converted value, accepted);
  * SEND_BATCH_MESSAGE is checked as SEND_MESSAGE_V2 (5.0's fix; 4.9.x checks nothing);
  * the five ACL admin codes (50-54) need an admin account (5.x: 50-52; 4.9.x: none);
  * a signature over _UNIQUE_KEY_QUERY is accepted too (4.9.4+ Java clients make it);
  * every segment of an IPv4 range pattern is honoured ("192.168.*.10-20" matches .10 to .20
    only; 4.x ignores all segments after the first '*' or '-' one, so it matched any last octet;
    "*.1.1.1" matches as written, 4.x failed on it at the first request); an IPv6 range keeps
    4.x's syntax (the last group, or the two last ones ending in '*') with "::" expanded as usual;
  * an IPv4-mapped IPv6 client address ("::ffff:10.0.0.1") is matched as its IPv4 address.
"""

from __future__ import annotations

import abc
import base64
import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smartgo.common.acl_sign import ACCESS_KEY, FORWARDED_FOR, SIGNATURE, UNIQUE_MSG_QUERY_FLAG, request_content
from smartgo.common.bodies import BodyError
from smartgo.common.heartbeat import parse_heartbeat
from smartgo.net.codes import RETRY_GROUP_TOPIC_PREFIX, TRACE_TOPIC, RequestCode, retry_topic

__all__ = [
    "ADMIN_CODES", "ANY", "DENY", "KEY_MIN_LENGTH", "PUB", "SUB", "Account", "AclConfig", "AclConfigError", "AclError",
    "AclValidator", "AddressStrategy", "address_strategy", "check_permission", "client_ip", "load_acl", "parse_acl",
    "parse_perm",
]

# Permission's bits
DENY = 1
ANY = 1 << 1
PUB = 1 << 2
SUB = 1 << 3

# Permission.ADMIN_CODE, with 5.x's ACL codes (50-52; 4.9.x let any account change the ACL) and
# the two 5.x left out: 53 rewrites the global white list, 54 returns every secret key
ADMIN_CODES = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC,                # 17
    RequestCode.UPDATE_BROKER_CONFIG,                   # 25
    RequestCode.DELETE_TOPIC_IN_BROKER,                 # 215
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,    # 200
    RequestCode.DELETE_SUBSCRIPTIONGROUP,               # 207
    RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,           # 50
    RequestCode.DELETE_ACL_CONFIG,                      # 51
    RequestCode.GET_BROKER_CLUSTER_ACL_INFO,            # 52
    RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,       # 53
    RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,          # 54
    RequestCode.NOTIFY_BROKER_ROLE_CHANGED,             # 1008: automatic failover's promotion
    RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,             # 306 and 329 delete store files now (SmartGo's: 4.x and
    RequestCode.DELETE_EXPIRED_COMMITLOG,               # 5.x let any account ask)
    # a registry's writes (smartgo.registry.server, a registry with acl_enable; 4.x's name server has no ACL)
    RequestCode.PUT_KV_CONFIG,                          # 100
    RequestCode.DELETE_KV_CONFIG,                       # 102
    RequestCode.WIPE_WRITE_PERM_OF_BROKER,              # 205
    RequestCode.ADD_WRITE_PERM_OF_BROKER,               # 327
    RequestCode.DELETE_TOPIC_IN_NAMESRV,                # 216
    RequestCode.UPDATE_NAMESRV_CONFIG,                  # 318
    RequestCode.CONTROLLER_ELECT_MASTER,                # 1002: a switchover
    RequestCode.MQTT_ADMIN,                             # 40001: lists devices, disconnects them
})

# AclConstants.ACCESS_KEY_MIN_LENGTH / SECRET_KEY_MIN_LENGTH: a key must be LONGER than this
KEY_MIN_LENGTH = 6

_PERMS = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}


class AclError(Exception):
    """A refused request; str() is 4.x's AclException message."""


class AclConfigError(ValueError):
    """A bad plain_acl.yml: the message names the file, the account and the field."""


# ---------------------------------------------------------------------------------------------
# Permission


def check_permission(needed: int, owned: int) -> bool:
    """Permission.checkPermission: DENY in `owned` refuses all; ANY needed takes PUB or SUB."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def parse_perm(text: str) -> int | None:
    """Permission.parsePermFromString for the five strings 4.x knows (outer blanks trimmed);
    None for anything else, which 4.x reads as DENY and this module refuses at load."""
    return _PERMS.get(text.strip())


def _group_resource(group: str | None) -> str | None:
    """The resource a group is checked as (PlainAccessResource.getRetryTopic)."""
    return None if group is None else retry_topic(group)


def is_retry_topic(name: str | None) -> bool:
    return name is not None and name.startswith(RETRY_GROUP_TOPIC_PREFIX)


def describe_resource(resource: str) -> str:
    """PlainAccessResource.printStr: "group:<group>" for a retry topic, else "topic:<name>"."""
    if is_retry_topic(resource):
        return "group:" + resource[len(RETRY_GROUP_TOPIC_PREFIX):]
    return "topic:" + resource


# ---------------------------------------------------------------------------------------------
# Remote address strategies (RemoteAddressStrategyFactory)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressStrategy(abc.ABC):
    """One whitelist pattern, parsed; match() takes a client address from client_ip()."""

    __slots__ = ("pattern",)

    def __init__(self, pattern: str | None) -> None:
        self.pattern = pattern

    @abc.abstractmethod
    def match(self, ip: IPAddress | None) -> bool:
        """Whether the client at ip is white-listed by this pattern."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.pattern!r})"


class _Nothing(AddressStrategy):
    """BlankRemoteAddressStrategy: no pattern, matches nobody."""
    __slots__ = ()

    def match(self, ip: IPAddress | None) -> bool:
        return False


class _Everyone(AddressStrategy):
    """NullRemoteAddressStrategy: "*", "*.*.*.*" or "*:*:*:*:*:*:*:*", matches everybody."""
    __slots__ = ()

    def match(self, ip: IPAddress | None) -> bool:
        return True


class _Exact(AddressStrategy):
    """OneRemoteAddressStrategy and MultipleRemoteAddressStrategy: a set of addresses."""
    __slots__ = ("addresses",)

    def __init__(self, pattern: str, addresses: Iterable[IPAddress]) -> None:
        super().__init__(pattern)
        self.addresses = frozenset(addresses)

    def match(self, ip: IPAddress | None) -> bool:
        return ip in self.addresses


class _Range(AddressStrategy):
    """RangeRemoteAddressStrategy: per unit (IPv4 octet, IPv6 16-bit group) a (low, high) bound."""
    __slots__ = ("version", "bounds")

    def __init__(self, pattern: str, version: int, bounds: tuple[tuple[int, int], ...]) -> None:
        super().__init__(pattern)
        self.version, self.bounds = version, bounds

    def match(self, ip: IPAddress | None) -> bool:
        if ip is None or ip.version != self.version:
            return False
        units = ip.packed if self.version == 4 else _groups(ip.packed)
        for unit, (low, high) in zip(units, self.bounds):
            if not low <= unit <= high:
                return False
        return True


def _groups(packed: bytes) -> list[int]:
    return [(packed[i] << 8) | packed[i + 1] for i in range(0, 16, 2)]


def _ip(text: str) -> IPAddress:
    """A literal IPv4 or IPv6 address (ValueError otherwise); IPv4 needs 4 decimal octets without
    leading zeros, as commons-validator's InetAddressValidator."""
    if ":" in text:
        return ipaddress.IPv6Address(text)
    return ipaddress.IPv4Address(text)


def _unit_range(text: str, limit: int, base: int, pattern: str) -> tuple[int, int]:
    """One range segment: "*", "low-high" or a single number, within 0..limit."""
    text = text.strip()
    if text == "*":
        return 0, limit
    parts = [p.strip() for p in text.split("-")]
    digits = "0123456789" if base == 10 else "0123456789abcdefABCDEF"
    if len(parts) > 2 or not all(p and all(c in digits for c in p) for p in parts):
        raise ValueError(f"{pattern!r}: segment {text!r} is not '*', a number or 'low-high'")
    low, high = (int(p, base) for p in (parts if len(parts) == 2 else parts * 2))
    if not 0 <= low <= high <= limit:
        raise ValueError(f"{pattern!r}: segment {text!r} must be within 0-{limit if base == 10 else 'ffff'}"
                         f" with low <= high")
    return low, high


def _ipv4_range(pattern: str) -> _Range:
    segments = pattern.split(".")
    if len(segments) != 4:
        raise ValueError(f"{pattern!r}: an IPv4 range needs four segments, like 192.168.1.* or 192.168.1.1-10 "
                         "(4.x refuses 192.168.* too)")
    bounds = tuple(_unit_range(s, 255, 10, pattern) for s in segments)
    return _Range(pattern, 4, bounds)


def _ipv6_range(pattern: str) -> _Range:
    # 4.x (AclUtils.IPv6AddressCheck): '*' only as the last group, a range only in the last group
    # or, before a last '*', in the one before it
    tokens = pattern.split(":")
    wild = 1
    if tokens[-1].strip() == "*" and len(tokens) >= 2 and "-" in tokens[-2]:
        wild = 2
    if any("*" in t or "-" in t for t in tokens[:-wild]):
        raise ValueError(f"{pattern!r}: in IPv6, '*' may only be the last group and a range only the last "
                         "group or the one before a last '*'")
    try:
        fixed = _groups(ipaddress.IPv6Address(":".join(tokens[:-wild] + ["0"] * wild)).packed)
    except ValueError as exc:
        raise ValueError(f"{pattern!r}: {exc}") from None
    bounds = [(g, g) for g in fixed[:8 - wild]]
    bounds += [_unit_range(t, 0xFFFF, 16, pattern) for t in tokens[-wild:]]
    return _Range(pattern, 6, tuple(bounds))


def _several(pattern: str, items: list[str]) -> _Exact:
    if not items:
        raise ValueError(f"{pattern!r}: lists no address")
    return _Exact(pattern, (_ip(item) for item in items))


def address_strategy(pattern: str | None) -> AddressStrategy:
    """RemoteAddressStrategyFactory.getRemoteAddressStrategy; ValueError for a bad pattern.

    Blank: matches nobody. "*", "*.*.*.*", "*:*:*:*:*:*:*:*": everybody. "a.b.c.{x,y}" or
    "v6::{x,y}": those addresses. "a,b,c": those addresses. A '*' or '-' in it: a range
    ("192.168.1.*", "192.168.1.1-10", "192.168.*.*", "10.1-5.*.*", "1050::5:*", "1050::5:1-ff").
    Else one address.
    """
    if pattern is None or not pattern.strip():
        return _Nothing(pattern)
    pattern = pattern.strip()
    if pattern in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return _Everyone(pattern)
    try:
        if pattern.endswith("}"):
            head, brace, items = pattern.partition("{")
            last = pattern.rsplit(":" if ":" in pattern else ".", 1)[-1]
            if not brace or not last.startswith("{") or "{" in items or (":" not in pattern and pattern.count(".") < 3):
                raise ValueError(f"{pattern!r}: write several addresses as 192.168.1.{{1,2,3}} (braces in the "
                                 "last segment only)")
            return _several(pattern, [head + item.strip() for item in items[:-1].split(",") if item.strip()])
        if "," in pattern:
            return _several(pattern, [item.strip() for item in pattern.split(",") if item.strip()])
        if "*" in pattern or "-" in pattern:
            return _ipv6_range(pattern) if ":" in pattern else _ipv4_range(pattern)
        return _Exact(pattern, (_ip(pattern),))
    except ipaddress.AddressValueError as exc:
        raise ValueError(f"{pattern!r}: not an IP address ({exc})") from None


def client_ip(remote_address: str | None) -> IPAddress | None:
    """The client's address from the request's remote address: 4.x keeps what is before the last
    ':' ("10.0.0.1:53211" -> 10.0.0.1, "::1:53211" -> ::1); "[v6]:port" and a bare IPv4 address
    are taken too. None when it is no IP address (which then only "*" patterns match)."""
    if not remote_address:
        return None
    text = remote_address.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif ":" in text:
        text = text[:text.rindex(":")]
    try:
        ip = _ip(text)
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


# ---------------------------------------------------------------------------------------------
# plain_acl.yml


@dataclass(frozen=True, slots=True)
class Account:
    """One account of plain_acl.yml, parsed (PlainAccessConfig -> PlainAccessResource)."""
    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: str | None
    address: AddressStrategy
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    # resource -> perm; a group under its retry topic name ("%RETRY%<group>")
    resource_perms: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class AclConfig:
    source: str
    global_white_remote_addresses: tuple[str, ...]
    global_white: tuple[AddressStrategy, ...]
    accounts: Mapping[str, Account]


def load_acl(path: str | Path) -> AclConfig:
    """Reads and validates a plain_acl.yml (AclConfigError naming the problem)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AclConfigError(f"{path}: cannot read the ACL file: {exc}") from None
    return parse_acl(text, str(path))


def parse_acl(text: str, source: str = "plain_acl.yml") -> AclConfig:
    """The same as load_acl from the file's text; `source` names it in errors."""
    node, data = _load_yaml(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AclConfigError(f"{source}: the file must be a mapping with globalWhiteRemoteAddresses and accounts, "
                             f"got a {_yaml_kind(data)}")
    raw_nodes = _account_key_nodes(node)

    white_raw: list[str] = []
    white: list[AddressStrategy] = []
    for j, item in enumerate(_sequence(data, "globalWhiteRemoteAddresses", source)):
        where = f"{source}: globalWhiteRemoteAddresses[{j}]"
        pattern = _scalar_text(item, where)
        try:
            strategy = address_strategy(pattern)
        except ValueError as exc:
            raise AclConfigError(f"{where}: {exc}") from None
        white_raw.append("" if pattern is None else pattern)
        if not isinstance(strategy, _Nothing):
            white.append(strategy)

    accounts: dict[str, Account] = {}
    first_at: dict[str, int] = {}
    for i, item in enumerate(_sequence(data, "accounts", source)):
        account = _account(item, f"{source}: accounts[{i}]", raw_nodes.get(i, {}))
        if account.access_key in accounts:
            raise AclConfigError(f"{source}: accounts[{i}]: accessKey {account.access_key!r} is already the accessKey "
                                 f"of accounts[{first_at[account.access_key]}] (4.x would keep the first and log it)")
        accounts[account.access_key] = account
        first_at[account.access_key] = i
    return AclConfig(source, tuple(white_raw), tuple(white), accounts)


def _load_yaml(text: str, source: str) -> tuple[Any, Any]:
    """The node tree (to see how a number was written) and the data, as yaml.safe_load. PyYAML
    is imported here, not with the module: every actor of a node imports this module through the
    net actor's, and only a node with ACL on reads YAML (about 1 MB an actor otherwise)."""
    import yaml
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise AclConfigError(f"{source}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    return node, data


def _account_key_nodes(node: Any) -> dict[int, dict[str, Any]]:
    """accounts[i] -> {key: scalar node}, for the accessKey and secretKey checks."""
    import yaml
    found: dict[int, dict[str, Any]] = {}
    if not isinstance(node, yaml.MappingNode):
        return found
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode) and key.value == "accounts" and isinstance(value, yaml.SequenceNode):
            for i, account in enumerate(value.value):
                if isinstance(account, yaml.MappingNode):
                    found[i] = {k.value: v for k, v in account.value
                                if isinstance(k, yaml.ScalarNode) and isinstance(v, yaml.ScalarNode)}
    return found


def _yaml_kind(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(value), type(value).__name__)


def _sequence(data: dict, name: str, where: str) -> list:
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise AclConfigError(f"{where}: {name} must be a list, got a {_yaml_kind(value)}: {value!r:.60}")
    return value


def _scalar_text(value: Any, where: str) -> str | None:
    """A scalar as the Java side reads it into a String field (fastjson conversion)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise AclConfigError(f"{where}: must be a string, got a {_yaml_kind(value)}: {value!r:.60}")


def _key_text(account: dict, name: str, where: str, raw: dict[str, Any]) -> str:
    """accessKey / secretKey: required, longer than 6 characters (PlainPermissionManager
    .checkPlainAccessConfig). A YAML number is taken as its text (secretKey: 12345678), as the
    Java side converts it, unless YAML would read another number than the text shows."""
    value = account.get(name)
    if value is None:
        raise AclConfigError(f"{where}: {name} is missing (4.x: cannot be null)")
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
        node = raw.get(name)
        if node is not None and node.value.strip() != text:
            raise AclConfigError(f"{where}: {name} {node.value!r} is read by YAML as the number {text}; "
                                 f"quote it ({name}: \"{node.value}\")")
    elif isinstance(value, str):
        text = value
    else:
        raise AclConfigError(f"{where}: {name} must be a string, got a {_yaml_kind(value)}; quote it")
    if len(text) <= KEY_MIN_LENGTH:
        raise AclConfigError(f"{where}: {name} must be longer than {KEY_MIN_LENGTH} characters, "
                             f"it has {len(text)}")
    return text


def _perm(value: Any, where: str) -> int:
    if value is None:
        return DENY                     # Permission.parsePermFromString(null)
    perm = parse_perm(value) if isinstance(value, str) else None
    if perm is None:
        raise AclConfigError(f"{where}: {value!r:.60} is not a permission: use DENY, PUB, SUB, PUB|SUB or SUB|PUB "
                             "(4.x would read it as DENY)")
    return perm


def _resource_perms(account: dict, name: str, where: str, to_resource, perms: dict[str, int]) -> None:
    """Permission.parseResourcePerms: "name=PERM" items (blanks around either trimmed)."""
    items = account.get(name)
    if items is None:
        return
    if not isinstance(items, list):
        raise AclConfigError(f"{where}: {name} must be a list of 'name=PERM', got a {_yaml_kind(items)}")
    for k, item in enumerate(items):
        at = f"{where}: {name}[{k}]"
        if not isinstance(item, str):
            raise AclConfigError(f"{at}: must be a string 'name=PERM', got a {_yaml_kind(item)}: {item!r:.60}")
        parts = [p for p in item.split("=") if p]     # StringUtils.split drops empty tokens
        if len(parts) != 2 or not parts[0].strip():
            raise AclConfigError(f"{at}: {item!r:.60} is not 'name=PERM' (4.x: Parse resource permission failed for "
                                 f"{'topic' if name == 'topicPerms' else 'group'}:{item})")
        perms[to_resource(parts[0].strip())] = _perm(parts[1], at)


def _account(item: Any, where: str, raw: dict[str, Any]) -> Account:
    if not isinstance(item, dict):
        raise AclConfigError(f"{where}: an account must be a mapping (accessKey, secretKey, ...), "
                             f"got a {_yaml_kind(item)}: {item!r:.60}")
    access_key = _key_text(item, "accessKey", where, raw)
    where = f"{where} (accessKey {access_key})"
    secret_key = _key_text(item, "secretKey", where, raw)

    white = _scalar_text(item.get("whiteRemoteAddress"), f"{where}: whiteRemoteAddress")
    try:
        address = address_strategy(white)
    except ValueError as exc:
        raise AclConfigError(f"{where}: whiteRemoteAddress: {exc}") from None

    admin = item.get("admin")
    if admin is None:
        admin = False
    elif isinstance(admin, str) and admin.strip().lower() in ("true", "false"):
        admin = admin.strip().lower() == "true"
    elif not isinstance(admin, bool):
        raise AclConfigError(f"{where}: admin must be true or false, got {admin!r:.60}")

    default_topic = _perm(item.get("defaultTopicPerm"), f"{where}: defaultTopicPerm")
    default_group = _perm(item.get("defaultGroupPerm"), f"{where}: defaultGroupPerm")
    perms: dict[str, int] = {}
    # 4.x parses groupPerms first, then topicPerms: a topic entry wins over the same name
    _resource_perms(item, "groupPerms", where, retry_topic, perms)
    _resource_perms(item, "topicPerms", where, lambda name: name, perms)
    return Account(access_key, secret_key, white, address, admin, default_topic, default_group, perms)


# ---------------------------------------------------------------------------------------------
# Validation (PlainAccessValidator.parse + PlainPermissionManager.validate / checkPerm)

_RESOURCE_CODES = frozenset({
    RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
    RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.PULL_MESSAGE, RequestCode.QUERY_MESSAGE,
    RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
    RequestCode.UPDATE_CONSUMER_OFFSET,
})


def _needed(code: int, ext: Mapping[str, str], body: bytes | None) -> dict[str, int]:
    """The resources a request needs, in the order 4.x adds them (its map is a HashMap, so which
    of several refused resources 4.x names first may differ)."""
    need: dict[str, int] = {}

    def add(resource: str | None, perm: int) -> None:
        if resource is not None:        # addResourceAndPerm skips null
            need[resource] = perm

    get = ext.get
    if code == RequestCode.SEND_MESSAGE:
        topic = get("topic")
        # 4.9.x (ISSUE #4426): a send to a retry topic needs SUB of the group in ext "group",
        # which SendMessageRequestHeader does not have, so it needs nothing; 5.x later checks SUB
        # of the retry topic itself (ISSUE #7909)
        if is_retry_topic(topic):
            add(_group_resource(get("group")), SUB)
        else:
            add(topic, PUB)
    elif code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        # SendMessageRequestHeaderV2: a = producerGroup, b = topic. 4.9.x checks nothing for
        # SEND_BATCH_MESSAGE (a batch to a DENY topic was accepted, ISSUE #5303); 5.0 checks it as
        # SEND_MESSAGE_V2, as here
        topic = get("b")
        if is_retry_topic(topic):
            add(_group_resource(get("a")), SUB)
        else:
            add(topic, PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        # 4.9.x: the group only (4.8 and earlier also wanted PUB of ext "originTopic")
        add(_group_resource(get("group")), SUB)
    elif code == RequestCode.PULL_MESSAGE:
        add(get("topic"), SUB)
        add(_group_resource(get("consumerGroup")), SUB)
    elif code == RequestCode.QUERY_MESSAGE:
        add(get("topic"), SUB)
    elif code == RequestCode.HEART_BEAT:
        try:
            heartbeat = parse_heartbeat(body)
        except BodyError as exc:
            raise AclError(f"Bad HEART_BEAT body: {exc}") from None
        for consumer in heartbeat.consumers:
            add(_group_resource(consumer.group), SUB)
            for subscription in consumer.subscriptions:
                add(subscription.topic, SUB)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        add(_group_resource(get("consumerGroup")), SUB)
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        add(_group_resource(get("consumerGroup")), SUB)
        add(get("topic"), SUB)
    return need


class AclValidator:
    """Checks requests against one AclConfig; build a new one when the file changes."""

    __slots__ = ("config", "_global_white", "_accounts", "_macs", "_ips")

    def __init__(self, config: AclConfig) -> None:
        self.config = config
        self._global_white = config.global_white
        self._accounts = dict(config.accounts)
        # a keyed HMAC per account, copied per request (saves the key setup)
        self._macs = {ak: hmac.new(a.secret_key.encode("utf-8"), digestmod=hashlib.sha1)
                      for ak, a in config.accounts.items()}
        self._ips: dict[str, IPAddress | None] = {}

    def resources(self, code: int, ext_fields: Mapping[str, str] | None, body: bytes | None) -> dict[str, int]:
        """What the request needs: resource ("%RETRY%<group>" for a group) -> PUB or SUB.
        AclError for a malformed HEART_BEAT body. No ext fields at all: nothing (4.x returns
        before reading them; only a white list can then pass the request)."""
        if ext_fields is None or code not in _RESOURCE_CODES:
            return {}
        return _needed(code, ext_fields, body)

    def _client_ip(self, remote_address: str) -> IPAddress | None:
        ip = self._ips.get(remote_address, False)
        if ip is False:
            if len(self._ips) >= 4096:
                self._ips.clear()
            ip = self._ips[remote_address] = client_ip(remote_address)
        return ip  # type: ignore[return-value]  # never False: a miss was replaced just above

    def _signature_ok(self, access_key: str, ext: Mapping[str, str], body: bytes | None) -> bool:
        given = ext.get(SIGNATURE)
        if given is None:
            return False
        given_bytes = given.encode("utf-8", "surrogatepass")
        mac = self._macs[access_key].copy()
        mac.update(request_content(ext, body))
        if hmac.compare_digest(base64.b64encode(mac.digest()), given_bytes):
            return True
        if UNIQUE_MSG_QUERY_FLAG in ext:
            # 4.9.x leaves _UNIQUE_KEY_QUERY out, but 4.9.4+ Java clients sign every ext field,
            # it included (4.9.4's "Check signature failed" on queries by unique key, ISSUE
            # #5310); 5.x takes it from clients above V4_9_3: accept either form
            mac = self._macs[access_key].copy()
            mac.update(request_content(ext, body, with_unique_key=True))
            return hmac.compare_digest(base64.b64encode(mac.digest()), given_bytes)
        return False

    def check(self, remote_address: str, code: int, ext_fields: dict[str, str] | None, body: bytes | None) -> None:
        """Raises AclError when the request may not pass."""
        need = self.resources(code, ext_fields, body)
        # a write a slave passed on: its address is the slave's, whose white-listing is not the client's
        ip = None if ext_fields is not None and FORWARDED_FOR in ext_fields else self._client_ip(remote_address or "")
        for strategy in self._global_white:
            if strategy.match(ip):
                return
        access_key = ext_fields.get(ACCESS_KEY) if ext_fields is not None else None
        if access_key is None:
            raise AclError("No accessKey is configured")
        account = self._accounts.get(access_key)
        if account is None:
            raise AclError(f"No acl config for {access_key}")
        if account.address.match(ip):
            return
        if not self._signature_ok(access_key, ext_fields, body):  # type: ignore[arg-type]  # has access_key
            raise AclError(f"Check signature failed for accessKey={access_key}")
        # 4.9.4+: sending message traces to the default trace topic needs no permission
        if need.get(TRACE_TOPIC) == PUB:
            return
        if code in ADMIN_CODES and not account.admin:
            raise AclError(f"Need admin permission for request code={int(code)}, but accessKey={access_key} is not")
        if not need:
            return
        owned = account.resource_perms
        if not owned and account.admin:
            # an admin with no topicPerms/groupPerms passes; one with some is held to them and
            # to its defaults, as in 4.x
            return
        for resource, needed in need.items():
            perm = owned.get(resource)
            if perm is None:
                perm = account.default_group_perm if is_retry_topic(resource) else account.default_topic_perm
            if not check_permission(needed, perm):
                # 4.9.x says "No default permission" for an explicit entry too (4.8-: "No permission")
                raise AclError(f"No default permission for {describe_resource(resource)}")
