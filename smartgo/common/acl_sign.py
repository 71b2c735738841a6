"""What a client of a node with ACL on needs (RocketMQ 4.x's AclClientRPCHook, AclUtils, AclSigner
and the ACL admin requests' PlainAccessConfig): the request signature and the account an ACL
admin request carries. Clients, the CLI and nodes' own calls sign with it; the checking side is
smartgo.common.acl_check, which only nodes load.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from smartgo.config import NodeConfig
from smartgo.net.client import RemotingClient
from smartgo.net.command import RemotingCommand

__all__ = [
    "ACCESS_CONFIG_FIELDS", "ACCESS_KEY", "FORWARDED_FOR", "SECURITY_TOKEN", "SIGNATURE", "UNIQUE_MSG_QUERY_FLAG",
    "AccessConfig", "node_client", "request_content", "sign", "sign_request", "signer", "split_list",
]

# SessionCredentials' ext field names
ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
# MixAll.UNIQUE_MSG_QUERY_FLAG: added by queryMessage after the 4.9.3- client signed, so unsigned
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
# SmartGo's: the client's address, which a slave adds to a client's write it passes on to its
# master (smartgo.broker.ha.master_forward), after the client signed. The master stores it as the
# message's born host, and judges the request on its signature alone: the connection's address is
# the slave's, which may be white-listed for the slave's own calls, and the field is the slave's word.
FORWARDED_FOR = "smartgoForwardedFor"


# ---------------------------------------------------------------------------------------------
# Signature (AclClientRPCHook, AclUtils.combineRequestContent, AclSigner)


def _java_order(keys: Iterable[str]) -> list[str]:
    """Java's String.compareTo order (TreeMap): UTF-16 code units, which differs from code point
    order only between a character above U+FFFF and one in U+E000..U+FFFF."""
    keys = list(keys)
    if all(k.isascii() for k in keys):
        return sorted(keys)
    return sorted(keys, key=lambda k: k.encode("utf-16-be", "surrogatepass"))


def _java_text(value: object) -> str:
    """A field value as Java's StringBuilder.append writes it (a msgpack header may carry numbers)."""
    if type(value) is str:
        return value
    if value is None:
        return "null"
    if type(value) is bool:
        return "true" if value else "false"
    return str(value)


def request_content(ext_fields: Mapping[str, str] | None, body: bytes | None, *,
                    with_unique_key: bool = False) -> bytes:
    """What is signed: the ext field values, by key in Java order, without Signature, FORWARDED_FOR
    and (unless with_unique_key) _UNIQUE_KEY_QUERY, UTF-8, then the body."""
    fields = ext_fields or {}
    text = "".join(_java_text(fields[k]) for k in _java_order(fields)
                   if k != SIGNATURE and k != FORWARDED_FOR and (with_unique_key or k != UNIQUE_MSG_QUERY_FLAG))
    content = text.encode("utf-8", "surrogatepass")
    return content + body if body else content


def _signature(content: bytes, secret_key: str) -> str:
    """AclSigner.calSignature: HmacSHA1 keyed by the secret key's UTF-8 bytes, Base64."""
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign(ext_fields: dict[str, str] | None, body: bytes | None, access_key: str, secret_key: str,
         security_token: str | None = None) -> dict[str, str]:
    """The fields AclClientRPCHook adds (AccessKey, Signature, SecurityToken when given) to a
    request with these ext fields and body; the caller merges them into the request's ext fields.

    The request's own ext fields (its header's fields, as after makeCustomHeaderToNet) are signed
    with AccessKey and SecurityToken, but neither a Signature already there nor _UNIQUE_KEY_QUERY:
    a 4.9.x broker leaves that one out (a 4.9.4+ Java client signs it, see AclValidator.check).
    """
    added = {ACCESS_KEY: access_key}
    if security_token is not None:
        added[SECURITY_TOKEN] = security_token
    signature = _signature(request_content({**(ext_fields or {}), **added}, body), secret_key)
    added[SIGNATURE] = signature
    return added


def signer(access_key: str, secret_key: str,
           security_token: str | None = None) -> Callable[[RemotingCommand], None] | None:
    """The request hook that signs with these credentials (AclClientRPCHook); None without an
    access key, so an unconfigured client or broker signs nothing."""
    if not access_key:
        return None
    return functools.partial(sign_request, access_key=access_key, secret_key=secret_key,
                             security_token=security_token or None)


def node_client(config: NodeConfig) -> RemotingClient:
    """A client for a node's own calls to other nodes (the failover registry's to brokers, a
    promoted slave's last copy): signed with its acl_access_key account, TLS with tls_enable."""
    return RemotingClient(request_hook=signer(config.acl_access_key, config.acl_secret_key),
                          ssl_context=config.outbound_tls())


def sign_request(cmd: RemotingCommand, access_key: str, secret_key: str, security_token: str | None = None) -> None:
    """AclClientRPCHook.doBeforeRequest: sign a request in place (its ext field values become the
    strings that go on the wire, as makeCustomHeaderToNet makes them)."""
    ext = {k: str(v) for k, v in (cmd.ext_fields or {}).items() if v is not None}
    ext.update(sign(ext, cmd.body_bytes() if cmd.body else None, access_key, secret_key, security_token))
    cmd.ext_fields = ext


# ---------------------------------------------------------------------------------------------
# ACL admin requests (UPDATE_AND_CREATE_ACL_CONFIG's header; the broker's edits are in
# smartgo.broker.acl.acl_file)

#: PlainAccessConfig's fields, in the order 4.x writes a new account
ACCESS_CONFIG_FIELDS = ("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                        "defaultGroupPerm", "topicPerms", "groupPerms")


def split_list(text: str | None) -> list[str] | None:
    """A header's comma list (UtilAll.split); "" is the empty list, blank items are dropped."""
    if text is None:
        return None
    return [item.strip() for item in text.split(",") if item.strip()]


@dataclass(frozen=True, slots=True)
class AccessConfig:
    """An account change as CreateAccessConfigRequestHeader carries it; None leaves a field as the
    file has it (4.x: a missing admin meant false). Perms are "name=PERM" strings."""
    access_key: str
    secret_key: str | None = field(default=None, repr=False)
    white_remote_address: str | None = None
    admin: bool | None = None
    default_topic_perm: str | None = None
    default_group_perm: str | None = None
    topic_perms: list[str] | None = None
    group_perms: list[str] | None = None

    def values(self) -> tuple:
        """The fields in ACCESS_CONFIG_FIELDS order."""
        return (self.access_key, self.secret_key, self.white_remote_address, self.admin, self.default_topic_perm,
                self.default_group_perm, self.topic_perms, self.group_perms)

    @classmethod
    def from_header(cls, ext: Mapping[str, str]) -> AccessConfig:
        admin = ext.get("admin")
        return cls(ext.get("accessKey") or "", ext.get("secretKey") or None, ext.get("whiteRemoteAddress"),
                   None if admin is None else admin.strip().lower() == "true",
                   ext.get("defaultTopicPerm") or None, ext.get("defaultGroupPerm") or None,
                   split_list(ext.get("topicPerms")), split_list(ext.get("groupPerms")))

    def to_header(self) -> dict[str, str]:
        def text(value: Any) -> str:
            if isinstance(value, bool):
                return str(value).lower()
            return ",".join(value) if isinstance(value, list) else value
        return {name: text(v) for name, v in zip(ACCESS_CONFIG_FIELDS, self.values()) if v is not None}
