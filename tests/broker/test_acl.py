"""RocketMQ 4.x plain ACL (smartgo.common.acl_check, acl_sign) without processes: signatures against independent
vectors, the request-code resource table, the check order and texts of 4.9.x, address patterns
and plain_acl.yml validation."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import subprocess

import pytest

from smartgo.common.acl_check import (ADMIN_CODES, ANY, DENY, PUB, SUB, AclConfigError, AclError, AclValidator,
                                      address_strategy, check_permission, client_ip, load_acl, parse_acl, parse_perm)
from smartgo.common.acl_sign import FORWARDED_FOR, request_content, sign
from smartgo.net.codes import RequestCode

pytestmark = pytest.mark.timeout(30)

# distribution/conf/plain_acl.yml of RocketMQ 4.x (4.7 - 4.9), comments dropped
SAMPLE = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"""

CLIENT = "172.16.5.9:53001"          # in no white list
AK, SK = "RocketMQ", "12345678"


def by_hand(text: str, body: bytes, secret: str) -> str:
    return base64.b64encode(hmac.new(secret.encode(), text.encode() + body, hashlib.sha1).digest()).decode()


def signed(fields: dict, body: bytes | None = None, ak: str = AK, sk: str = SK) -> dict:
    return {**fields, **sign(fields, body, ak, sk)}


@pytest.fixture(scope="module")
def validator() -> AclValidator:
    return AclValidator(parse_acl(SAMPLE))


def refused(v: AclValidator, code: int, fields: dict | None, body: bytes | None = None, addr: str = CLIENT) -> str:
    with pytest.raises(AclError) as info:
        v.check(addr, code, fields, body)
    return str(info.value)


def heartbeat(consumers: list[tuple[str, list[str]]], producers: tuple[str, ...] = ()) -> bytes:
    return json.dumps({
        "clientID": "10.0.0.1@1",
        "consumerDataSet": [{"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                             "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                             "subscriptionDataSet": [{"topic": t, "subString": "*"} for t in topics]}
                            for g, topics in consumers],
        "producerDataSet": [{"groupName": p} for p in producers]}).encode()


# ---------------------------------------------------------------------------------------------
# Signatures


def test_sign_against_a_vector_by_hand():
    # Java String order: "AccessKey" < "a" < "b" (upper case sorts first), values concatenated
    out = sign({"b": "TopicA", "a": "PG"}, b"hello", "RocketMQ", "12345678")
    assert out == {"AccessKey": "RocketMQ", "Signature": by_hand("RocketMQPGTopicA", b"hello", "12345678")}


def test_sign_with_security_token_and_no_body():
    out = sign({"b": "TopicA", "a": "PG"}, None, "RocketMQ", "12345678", security_token="tok")
    # AccessKey < SecurityToken < a < b
    assert out["SecurityToken"] == "tok"
    assert out["Signature"] == by_hand("RocketMQtokPGTopicA", b"", "12345678")
    assert sign({}, b"", "RocketMQ", "12345678")["Signature"] == by_hand("RocketMQ", b"", "12345678")


def test_sign_leaves_out_a_stale_signature_and_the_unique_key_flag():
    base = sign({"topic": "T"}, b"x", AK, SK)["Signature"]
    assert sign({"topic": "T", "Signature": "old", "_UNIQUE_KEY_QUERY": "true"}, b"x", AK, SK)["Signature"] == base
    assert sign({"topic": "T", "AccessKey": "someone-else"}, b"x", AK, SK)["Signature"] == base


def test_content_uses_java_utf16_order_and_utf8():
    # U+10000 is the surrogate pair D800 DC00 in Java, which sorts before U+FFFF (code points: after)
    assert request_content({"\uffff": "A", "\U00010000": "B"}, None) == b"BA"
    assert request_content({"k": "Ä"}, b"\x00\xff") == "Ä".encode() + b"\x00\xff"
    assert request_content({"b": "2", "a": "1", "Signature": "s", "_UNIQUE_KEY_QUERY": "u"}, None) == b"12"
    assert request_content({"a": "1", "_UNIQUE_KEY_QUERY": "u"}, None, with_unique_key=True) == b"u1"


# the ali-ons channel.beforeRequest algorithm (its header fields, AccessKey and OnsChannel in a Map,
# keys sorted by JavaScript's default sort, values joined, UTF-8, body appended, HMAC-SHA1, base64)
NODE_SIGNER = r"""
const crypto = require('crypto');
const input = JSON.parse(process.argv[1]);
const map = new Map();
map.set('AccessKey', input.ak);
map.set('OnsChannel', 'ALIYUN');
for (const k of Object.keys(input.fields)) map.set(k, input.fields[k]);
let val = '';
for (const k of Array.from(map.keys()).sort()) if (k !== 'Signature') val += map.get(k);
let total = Buffer.from(val, 'utf8');
const body = Buffer.from(input.body, 'base64');
if (body.length) total = Buffer.concat([total, body]);
process.stdout.write(crypto.createHmac('sha1', input.sk).update(total).digest('base64'));
"""


def test_sign_matches_an_external_hmac(validator):
    """A vector from Node's crypto (ali-ons' own algorithm) when node is installed, else from
    openssl, else from Python's hmac on the hand-built string; the validator accepts it and
    sign() reproduces it."""
    fields = {"producerGroup": "PG_Ä", "topic": "topicB", "queueId": "3", "Zeta": "z", "_x": "u", "sysFlag": "0"}
    body = "body ü".encode() + bytes(range(256))
    by_key = {**fields, "AccessKey": AK, "OnsChannel": "ALIYUN"}
    content = "".join(by_key[k] for k in sorted(by_key)).encode() + body
    assert content.startswith("RocketMQALIYUNz".encode())     # upper case, then '_', then lower case
    if shutil.which("node"):
        run = subprocess.run(["node", "-e", NODE_SIGNER, json.dumps(
            {"ak": AK, "sk": SK, "fields": fields, "body": base64.b64encode(body).decode()})],
            capture_output=True, timeout=20, check=True)
        external = run.stdout.decode()
    elif shutil.which("openssl"):
        run = subprocess.run(["openssl", "dgst", "-sha1", "-hmac", SK, "-binary"], input=content,
                             capture_output=True, timeout=20, check=True)
        external = base64.b64encode(run.stdout).decode()
    else:
        external = base64.b64encode(hmac.new(SK.encode(), content, hashlib.sha1).digest()).decode()
    assert len(base64.b64decode(external)) == 20
    assert sign({**fields, "OnsChannel": "ALIYUN"}, body, AK, SK)["Signature"] == external
    # what the broker receives from ali-ons: the header fields, AccessKey, OnsChannel, Signature
    validator.check(CLIENT, RequestCode.SEND_MESSAGE, {**by_key, "Signature": external}, body)
    with pytest.raises(AclError):
        validator.check(CLIENT, RequestCode.SEND_MESSAGE, {**by_key, "Signature": external}, body[:-1])


# ---------------------------------------------------------------------------------------------
# check(): white lists, keys, signatures


def test_global_white_list_passes_without_anything(validator):
    validator.check("10.10.103.77:4000", RequestCode.SEND_MESSAGE, None, None)
    validator.check("192.168.0.3:4000", RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "topicA"}, None)
    validator.check("10.10.103.1:1", RequestCode.SEND_MESSAGE, {"AccessKey": "nobody", "Signature": "x"}, None)
    assert refused(validator, RequestCode.SEND_MESSAGE, None, addr="10.10.104.77:4000") == "No accessKey is configured"


def test_account_white_list_skips_the_signature_but_not_the_key(validator):
    fields = {"topic": "topicA", "AccessKey": "rocketmq2", "Signature": "garbage"}
    validator.check("192.168.1.200:999", RequestCode.SEND_MESSAGE, fields, None)
    assert (refused(validator, RequestCode.SEND_MESSAGE, fields, addr="192.168.2.200:999")
            == "Check signature failed for accessKey=rocketmq2")
    # RocketMQ's whiteRemoteAddress is empty: it white-lists nobody
    assert refused(validator, RequestCode.SEND_MESSAGE, {"topic": "topicB", "AccessKey": AK, "Signature": "x"},
                   addr="192.168.1.200:999") == "Check signature failed for accessKey=RocketMQ"


def test_a_write_a_slave_passed_on_is_judged_on_its_signature_not_the_slaves_address(validator):
    """The slave's address may be white-listed (for its own copies of the master's tables): a
    client's write it forwards carries FORWARDED_FOR (the client's address, the slave's word),
    added after the client signed, and passes
    only on the client's own signature and permissions."""
    slave = "10.10.103.77:4000"                          # in the global white list
    fields = {"topic": "topicB", FORWARDED_FOR: "10.0.0.9:5000"}
    assert refused(validator, RequestCode.SEND_MESSAGE, fields, addr=slave) == "No accessKey is configured"
    signed_by_client = {**signed({"topic": "topicB"}, b"m"), FORWARDED_FOR: "10.0.0.9:5000"}
    validator.check(slave, RequestCode.SEND_MESSAGE, signed_by_client, b"m")
    denied = {**signed({"topic": "topicA"}, b"m"), FORWARDED_FOR: "10.0.0.9:5000"}
    assert refused(validator, RequestCode.SEND_MESSAGE, denied, b"m", addr=slave) == \
        "No default permission for topic:topicA"
    white = {"topic": "topicA", "AccessKey": "rocketmq2", "Signature": "garbage", FORWARDED_FOR: "x"}
    assert refused(validator, RequestCode.SEND_MESSAGE, white, addr="192.168.1.200:999") == \
        "Check signature failed for accessKey=rocketmq2"        # nor the account's own white list


def test_missing_and_unknown_access_key(validator):
    assert refused(validator, RequestCode.SEND_MESSAGE, None) == "No accessKey is configured"
    assert refused(validator, RequestCode.SEND_MESSAGE, {"topic": "topicB"}) == "No accessKey is configured"
    assert refused(validator, RequestCode.SEND_MESSAGE, signed({"topic": "topicB"}, ak="nobody1")) == \
        "No acl config for nobody1"
    assert refused(validator, 28, {"AccessKey": ""}) == "No acl config for "


def test_a_good_signature_passes(validator):
    validator.check(CLIENT, RequestCode.SEND_MESSAGE, signed({"topic": "topicB"}, b"payload"), b"payload")
    validator.check(CLIENT, int(RequestCode.GET_BROKER_RUNTIME_INFO), signed({}), None)
    validator.check(CLIENT, RequestCode.GET_BROKER_RUNTIME_INFO, {**sign(None, None, AK, SK)}, None)


@pytest.mark.parametrize("change", ["body byte", "field value", "no signature", "other secret", "added field"])
def test_bad_signatures(validator, change):
    body = b"payload-payload"
    fields = signed({"topic": "topicB", "queueId": "1"}, body)
    if change == "body byte":
        body = body[:3] + b"X" + body[4:]
    elif change == "field value":
        fields["queueId"] = "2"
    elif change == "no signature":
        del fields["Signature"]
    elif change == "other secret":
        fields = signed({"topic": "topicB", "queueId": "1"}, body, sk="87654321")
    else:
        fields["tags"] = "x"
    assert refused(validator, RequestCode.SEND_MESSAGE, fields, body) == "Check signature failed for accessKey=RocketMQ"


def test_unique_key_flag_signed_or_not(validator):
    fields = {"topic": "topicC", "key": "k1", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": "9"}
    # 4.9.3- clients: added after signing
    validator.check(CLIENT, RequestCode.QUERY_MESSAGE, {**signed(fields), "_UNIQUE_KEY_QUERY": "true"}, None)
    # 4.9.4+ Java clients sign every ext field, the flag included
    with_flag = {**fields, "_UNIQUE_KEY_QUERY": "true", "AccessKey": AK}
    sig = by_hand("".join(with_flag[k] for k in sorted(with_flag)), b"", SK)
    validator.check(CLIENT, RequestCode.QUERY_MESSAGE, {**with_flag, "Signature": sig}, None)
    assert refused(validator, RequestCode.QUERY_MESSAGE, {**with_flag, "Signature": sig, "_UNIQUE_KEY_QUERY": "false"}) \
        == "Check signature failed for accessKey=RocketMQ"
    assert refused(validator, RequestCode.QUERY_MESSAGE, {**signed(fields), "_UNIQUE_KEY_QUERY": "true", "key": "k2"}) \
        == "Check signature failed for accessKey=RocketMQ"


# ---------------------------------------------------------------------------------------------
# Admin codes and the order of the checks


def test_admin_code_set():
    assert ADMIN_CODES == {17, 25, 215, 200, 207, 50, 51, 52, 53, 54, 1008, 306, 329, 100, 102, 205, 327, 216, 318,
                           1002, 40001}


@pytest.mark.parametrize("code", sorted(int(c) for c in ADMIN_CODES))
def test_admin_codes_need_an_admin(validator, code):
    fields = {"topic": "topicB"}
    assert refused(validator, code, signed(fields)) == \
        f"Need admin permission for request code={code}, but accessKey=RocketMQ is not"
    # rocketmq2 is admin (and has no perms at all): it passes from outside its white list
    validator.check(CLIENT, code, signed(fields, ak="rocketmq2"), None)


def test_admin_without_perms_passes_every_resource(validator):
    # rocketmq2: admin, no topicPerms/groupPerms, defaults DENY (unset)
    for code, fields in [(RequestCode.SEND_MESSAGE, {"topic": "topicA"}),
                         (RequestCode.PULL_MESSAGE, {"topic": "topicA", "consumerGroup": "groupA"}),
                         (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "groupA"})]:
        validator.check(CLIENT, code, signed(fields, ak="rocketmq2"), None)


def test_check_order(validator):
    # a bad signature is reported before the admin code and the resources
    assert refused(validator, 17, {"topic": "topicA", "AccessKey": AK, "Signature": "x"}) == \
        "Check signature failed for accessKey=RocketMQ"
    # the admin check comes before the resources
    assert refused(validator, 17, signed({"topic": "topicA"})).startswith("Need admin permission")
    # an unknown key is refused before its (nonexistent) white list; the global list comes first
    validator.check("10.10.103.9:1", 17, {"AccessKey": "nobody1"}, None)


# ---------------------------------------------------------------------------------------------
# Resources per request code (RocketMQ: topics DENY by default, groups SUB by default;
# topicA DENY, topicB PUB|SUB, topicC SUB; groupA DENY, groupB PUB|SUB, groupC SUB)

CASES = [
    # code, fields, None (passes) or the refusal text
    (RequestCode.SEND_MESSAGE, {"topic": "topicB"}, None),
    (RequestCode.SEND_MESSAGE, {"topic": "topicC"}, "No default permission for topic:topicC"),
    (RequestCode.SEND_MESSAGE, {"topic": "topicA"}, "No default permission for topic:topicA"),
    (RequestCode.SEND_MESSAGE, {"topic": "topicX"}, "No default permission for topic:topicX"),
    (RequestCode.SEND_MESSAGE, {"b": "topicA", "producerGroup": "PG"}, None),      # v1 ignores "b"
    (RequestCode.SEND_MESSAGE, {"topic": "%RETRY%groupA", "group": "groupA"}, "No default permission for group:groupA"),
    (RequestCode.SEND_MESSAGE, {"topic": "%RETRY%groupC", "group": "groupC"}, None),
    # 4.9.x reads a "group" field SendMessageRequestHeader does not have: nothing is needed
    (RequestCode.SEND_MESSAGE, {"topic": "%RETRY%groupA", "producerGroup": "groupA"}, None),
    (RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "topicB"}, None),
    (RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "topicC", "topic": "topicB"}, "No default permission for topic:topicC"),
    (RequestCode.SEND_MESSAGE_V2, {"a": "PG", "topic": "topicA"}, None),          # v2 reads only "b"
    (RequestCode.SEND_MESSAGE_V2, {"a": "groupA", "b": "%RETRY%groupC"}, "No default permission for group:groupA"),
    (RequestCode.SEND_MESSAGE_V2, {"a": "groupC", "b": "%RETRY%groupA"}, None),
    (RequestCode.SEND_BATCH_MESSAGE, {"a": "PG", "b": "topicA"}, "No default permission for topic:topicA"),
    (RequestCode.SEND_BATCH_MESSAGE, {"a": "PG", "b": "topicB"}, None),
    (RequestCode.SEND_MESSAGE, {"topic": "RMQ_SYS_TRACE_TOPIC"}, None),            # trace topic exemption
    (RequestCode.SEND_MESSAGE_V2, {"b": "RMQ_SYS_TRACE_TOPIC"}, None),
    (RequestCode.PULL_MESSAGE, {"topic": "RMQ_SYS_TRACE_TOPIC", "consumerGroup": "groupC"},
     "No default permission for topic:RMQ_SYS_TRACE_TOPIC"),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "groupC", "originTopic": "topicA"}, None),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "groupA", "originTopic": "topicB"},
     "No default permission for group:groupA"),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "groupZ"}, None),              # defaultGroupPerm SUB
    (RequestCode.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupC"}, None),
    (RequestCode.PULL_MESSAGE, {"topic": "topicB", "consumerGroup": "groupB"}, None),
    (RequestCode.PULL_MESSAGE, {"topic": "topicA", "consumerGroup": "groupC"}, "No default permission for topic:topicA"),
    (RequestCode.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupA"}, "No default permission for group:groupA"),
    (RequestCode.PULL_MESSAGE, {"topic": "topicX", "consumerGroup": "groupC"}, "No default permission for topic:topicX"),
    (RequestCode.QUERY_MESSAGE, {"topic": "topicC"}, None),
    (RequestCode.QUERY_MESSAGE, {"topic": "topicA"}, "No default permission for topic:topicA"),
    (RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "consumerGroup": "groupA"}, "No default permission for group:groupA"),
    (RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "producerGroup": "groupA"}, None),
    (RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "consumerGroup": "groupB"}, None),
    (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "groupA"}, "No default permission for group:groupA"),
    (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "groupB"}, None),
    (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {}, None),                        # missing field: no resource
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "groupC", "topic": "topicC", "queueId": "0",
                                          "commitOffset": "5"}, None),
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "groupC", "topic": "topicA", "queueId": "0",
                                          "commitOffset": "5"}, "No default permission for topic:topicA"),
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "groupA", "topic": "topicC", "queueId": "x"},
     "No default permission for group:groupA"),
    # 4.9.x needs nothing for these
    (RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "groupA", "topic": "topicA", "queueId": "0"}, None),
    (RequestCode.END_TRANSACTION, {"producerGroup": "groupA", "tranStateTableOffset": "1"}, None),
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "topicA"}, None),
]


@pytest.mark.parametrize("code,fields,expected", CASES,
                         ids=[f"{RequestCode(c).name}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_resources_by_code(validator, code, fields, expected):
    request = signed(fields)
    if expected is None:
        validator.check(CLIENT, code, request, None)
    else:
        assert refused(validator, code, request) == expected


HEARTBEATS = [
    ([("groupC", ["topicC", "%RETRY%groupC"])], None),
    ([("groupZ", ["topicB"])], None),
    ([("groupC", ["topicC", "topicA"])], "No default permission for topic:topicA"),
    ([("groupA", ["topicC"])], "No default permission for group:groupA"),
    # a subscribed retry topic counts as its group
    ([("groupC", ["%RETRY%groupA"])], "No default permission for group:groupA"),
    ([("groupC", ["topicC"]), ("groupB", ["topicX"])], "No default permission for topic:topicX"),
    ([], None),
]


@pytest.mark.parametrize("consumers,expected", HEARTBEATS)
def test_heart_beat_bodies(validator, consumers, expected):
    body = heartbeat(consumers, producers=("topicA-producers",))
    request = signed({}, body)
    if expected is None:
        validator.check(CLIENT, RequestCode.HEART_BEAT, request, body)
    else:
        assert refused(validator, RequestCode.HEART_BEAT, request, body) == expected


@pytest.mark.parametrize("body", [b"{not json", b"", None, b'{"consumerDataSet": [{"groupName": 5}]}', b"[1]"])
def test_malformed_heart_beat_is_refused_even_when_white_listed(validator, body):
    for addr in (CLIENT, "10.10.103.4:1"):
        text = refused(validator, RequestCode.HEART_BEAT, signed({}, body), body, addr=addr)
        assert text.startswith("Bad HEART_BEAT body: HeartbeatData")


def test_no_ext_fields_reads_nothing(validator):
    # 4.x returns from parse before the body when extFields is null: only a white list passes it
    assert validator.resources(RequestCode.HEART_BEAT, None, b"{bad") == {}
    validator.check("10.10.103.4:1", RequestCode.HEART_BEAT, None, b"{bad")
    assert refused(validator, RequestCode.HEART_BEAT, None, b"{bad") == "No accessKey is configured"


def test_resources_table(validator):
    r = validator.resources
    assert r(RequestCode.PULL_MESSAGE, {"topic": "T", "consumerGroup": "G"}, None) == {"T": SUB, "%RETRY%G": SUB}
    assert r(RequestCode.SEND_MESSAGE_V2, {"a": "P", "b": "T"}, None) == {"T": PUB}
    assert r(RequestCode.HEART_BEAT, {}, heartbeat([("G", ["T1", "T2"])])) == \
        {"%RETRY%G": SUB, "T1": SUB, "T2": SUB}
    assert r(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "G", "topic": "T"}, None) == \
        {"%RETRY%G": SUB, "T": SUB}
    assert r(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "G", "topic": "T"}, None) == {}


# ---------------------------------------------------------------------------------------------
# Permissions: DENY, ANY, defaults, admins

PERMS_YML = """\
accounts:
  - accessKey: openAccount
    secretKey: openSecret1
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: DENY
    topicPerms: [secret=DENY, "  padded  =  SUB  "]
    groupPerms: [allowed=SUB]
  - accessKey: adminWithPerms
    secretKey: adminSecret
    admin: true
    topicPerms: [topicB=PUB]
  - accessKey: noDefaults
    secretKey: noDefaults1
  - accessKey: both-lists
    secretKey: both-lists
    groupPerms: [g=DENY]
    topicPerms: ["%RETRY%g=SUB"]
"""


@pytest.fixture(scope="module")
def perms() -> AclValidator:
    return AclValidator(parse_acl(PERMS_YML))


def test_check_permission_semantics():
    assert check_permission(PUB, PUB | SUB) and check_permission(SUB, PUB | SUB)
    assert check_permission(PUB, PUB) and not check_permission(PUB, SUB) and not check_permission(SUB, PUB)
    # DENY in what is owned overrides any other bit
    assert not check_permission(PUB, DENY | PUB) and not check_permission(SUB, DENY | PUB | SUB)
    # ANY needed: PUB or SUB owned
    assert check_permission(ANY, PUB) and check_permission(ANY, SUB) and check_permission(ANY, PUB | SUB)
    assert not check_permission(ANY, DENY) and not check_permission(ANY, 0) and not check_permission(ANY, ANY)
    assert not check_permission(ANY, DENY | PUB)


def test_parse_perm():
    assert [parse_perm(s) for s in ("DENY", "PUB", "SUB", "PUB|SUB", "SUB|PUB", " SUB ")] == \
        [DENY, PUB, SUB, PUB | SUB, PUB | SUB, SUB]
    assert parse_perm("ANY") is None and parse_perm("pub") is None and parse_perm("PUB | SUB") is None


def test_explicit_deny_overrides_the_default(perms):
    def fields(**kw):
        return signed(kw, ak="openAccount", sk="openSecret1")
    perms.check(CLIENT, RequestCode.SEND_MESSAGE, fields(topic="anything"), None)
    assert refused(perms, RequestCode.SEND_MESSAGE, fields(topic="secret")) == "No default permission for topic:secret"
    assert refused(perms, RequestCode.QUERY_MESSAGE, fields(topic="secret")) == "No default permission for topic:secret"
    # trimmed name and perm: "padded" is SUB only
    perms.check(CLIENT, RequestCode.QUERY_MESSAGE, fields(topic="padded"), None)
    assert refused(perms, RequestCode.SEND_MESSAGE, fields(topic="padded")) == "No default permission for topic:padded"
    # defaultGroupPerm DENY, an explicit group SUB
    assert refused(perms, RequestCode.PULL_MESSAGE, fields(topic="t", consumerGroup="other")) == \
        "No default permission for group:other"
    perms.check(CLIENT, RequestCode.PULL_MESSAGE, fields(topic="t", consumerGroup="allowed"), None)


def test_missing_defaults_deny(perms):
    f = signed({"topic": "t"}, ak="noDefaults", sk="noDefaults1")
    assert refused(perms, RequestCode.SEND_MESSAGE, f) == "No default permission for topic:t"
    f = signed({"group": "g"}, ak="noDefaults", sk="noDefaults1")
    assert refused(perms, RequestCode.CONSUMER_SEND_MSG_BACK, f) == "No default permission for group:g"


def test_admin_with_perms_is_held_to_them(perms):
    f = signed({"topic": "topicB"}, ak="adminWithPerms", sk="adminSecret")
    perms.check(CLIENT, RequestCode.SEND_MESSAGE, f, None)
    perms.check(CLIENT, RequestCode.UPDATE_AND_CREATE_TOPIC, f, None)
    f = signed({"topic": "topicZ"}, ak="adminWithPerms", sk="adminSecret")
    assert refused(perms, RequestCode.SEND_MESSAGE, f) == "No default permission for topic:topicZ"


def test_topic_perms_win_over_group_perms_of_the_same_resource(perms):
    f = signed({"group": "g"}, ak="both-lists", sk="both-lists")
    perms.check(CLIENT, RequestCode.CONSUMER_SEND_MSG_BACK, f, None)


# ---------------------------------------------------------------------------------------------
# Remote address strategies

MATCHES = [
    ("*", "1.2.3.4", True), ("*.*.*.*", "9.9.9.9", True), ("*:*:*:*:*:*:*:*", "::1", True),
    ("*", "not-an-address", True),
    ("192.168.1.1", "192.168.1.1", True), ("192.168.1.1", "192.168.1.2", False),
    ("192.168.1.{1,2,3}", "192.168.1.3", True), ("192.168.1.{1,2,3}", "192.168.1.4", False),
    ("192.168.1.{1, 2}", "192.168.1.2", True),
    ("10.0.0.1,10.0.0.2", "10.0.0.2", True), ("10.0.0.1,10.0.0.2", "10.0.0.3", False),
    ("10.0.0.1,::1", "::1", True),
    ("192.168.1.*", "192.168.1.255", True), ("192.168.1.*", "192.168.2.1", False),
    ("192.168.*.*", "192.168.77.1", True), ("192.168.*.*", "192.169.0.1", False),
    ("10.*.*.*", "10.200.3.4", True),
    ("192.168.1.1-10", "192.168.1.10", True), ("192.168.1.1-10", "192.168.1.11", False),
    ("192.168.1.1-10", "192.168.1.0", False), ("192.168.1-3.*", "192.168.2.99", True),
    ("192.168.1-3.*", "192.168.4.1", False),
    # every segment counts (4.x ignored what follows the first range segment)
    ("192.168.*.10-20", "192.168.5.15", True), ("192.168.*.10-20", "192.168.5.21", False),
    ("10.1-2.3-4.5", "10.2.4.5", True), ("10.1-2.3-4.5", "10.2.4.6", False),
    ("*.1.1.1", "200.1.1.1", True), ("*.1.1.1", "200.1.1.2", False),
    ("192.168.1.1", "::ffff:192.168.1.1", True),
    ("::1", "0:0:0:0:0:0:0:1", True), ("1050:0:0:0:5:600:300c:326b", "1050::5:600:300c:326b", True),
    ("1050::{1,2}", "1050::2", True), ("1050::{1,2}", "1050::3", False),
    ("1050::5:*", "1050::5:ffff", True), ("1050::5:*", "1050::6:1", False),
    ("1050::5:1-ff", "1050::5:ff", True), ("1050::5:1-ff", "1050::5:100", False),
    ("1050::5:1-ff:*", "1050::5:a0:1234", True), ("1050::5:1-ff:*", "1050::5:100:1", False),
    ("192.168.1.*", "::1", False), ("::1", "0.0.0.1", False),
    ("", "1.2.3.4", False), (None, "1.2.3.4", False), ("   ", "1.2.3.4", False),
]


@pytest.mark.parametrize("pattern,addr,expected", MATCHES)
def test_address_strategies(pattern, addr, expected):
    # the remote address as the net actor gives it: "ip:port"
    assert address_strategy(pattern).match(client_ip(f"{addr}:4242")) is expected


@pytest.mark.parametrize("pattern", [
    "192.168.*", "192.168.1", "192.168.1.256", "192.168.1.300-400", "192.168.1.10-1", "192.168.1.-5",
    "192.168.1.1-2-3", "a.b.c.d", "192.168.1.x-5", "192.168.{1,2}.1", "192.168.1.{1,2", "{1,2}",
    "192.168.1.{}", ",", "10.0.0.1,10.0.0", "1050:*:5", "1050::5:*:1", "1050::zz:*", "1050::5:1-fffff",
    "192.168.01.1", "192.168.1.1_0", "192.168.999.*", "192.168.1.*.1",
])
def test_invalid_patterns(pattern):
    with pytest.raises(ValueError):
        address_strategy(pattern)


def test_invalid_patterns_are_refused_at_load():
    with pytest.raises(AclConfigError, match=r"my\.yml: globalWhiteRemoteAddresses\[1\]: '192\.168\.\*'"):
        parse_acl("globalWhiteRemoteAddresses: ['10.0.0.*', '192.168.*']\n", "my.yml")
    with pytest.raises(AclConfigError, match=r"accounts\[0\] \(accessKey abcdefg\): whiteRemoteAddress: "):
        parse_acl("accounts:\n- {accessKey: abcdefg, secretKey: abcdefg, whiteRemoteAddress: 1.2.3.999}\n")


@pytest.mark.parametrize("remote,ip", [
    ("10.0.0.1:53211", "10.0.0.1"), ("10.0.0.1", "10.0.0.1"), ("::1:53211", "::1"), ("[::1]:53211", "::1"),
    ("0:0:0:0:0:0:0:1:5", "::1"), ("::ffff:10.0.0.1:7", "10.0.0.1"),
])
def test_client_ip(remote, ip):
    assert str(client_ip(remote)) == ip


@pytest.mark.parametrize("remote", [None, "", "?", "host.example:5", "10.0.0:1"])
def test_client_ip_unknown(remote):
    assert client_ip(remote) is None


# ---------------------------------------------------------------------------------------------
# plain_acl.yml


def test_the_4x_sample_file():
    config = parse_acl(SAMPLE, "plain_acl.yml")
    assert config.global_white_remote_addresses == ("10.10.103.*", "192.168.0.*")
    assert set(config.accounts) == {"RocketMQ", "rocketmq2"}
    rocketmq = config.accounts["RocketMQ"]
    assert rocketmq.secret_key == "12345678" and not rocketmq.admin
    assert (rocketmq.default_topic_perm, rocketmq.default_group_perm) == (DENY, SUB)
    assert rocketmq.resource_perms == {
        "topicA": DENY, "topicB": PUB | SUB, "topicC": SUB,
        "%RETRY%groupA": DENY, "%RETRY%groupB": PUB | SUB, "%RETRY%groupC": SUB}
    assert rocketmq.white_remote_address is None and not rocketmq.address.match(client_ip("1.2.3.4:5"))
    admin = config.accounts["rocketmq2"]
    assert admin.admin and admin.resource_perms == {} and admin.default_topic_perm == DENY
    assert admin.address.match(client_ip("192.168.1.9:1")) and "12345678" not in repr(admin)


def test_numbers_as_keys_are_their_text():
    config = parse_acl("accounts:\n- accessKey: 1234567\n  secretKey: 987654321\n  defaultTopicPerm: PUB\n")
    account = config.accounts["1234567"]
    assert account.secret_key == "987654321"
    v = AclValidator(config)
    v.check(CLIENT, RequestCode.SEND_MESSAGE, signed({"topic": "t"}, ak="1234567", sk="987654321"), None)


def test_load_acl_and_empty_files(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(SAMPLE)
    assert set(load_acl(path).accounts) == {"RocketMQ", "rocketmq2"}
    assert set(load_acl(str(path)).accounts) == {"RocketMQ", "rocketmq2"}
    with pytest.raises(AclConfigError, match="missing.yml: cannot read"):
        load_acl(tmp_path / "missing.yml")
    for text in ("", "# nothing\n", "accounts:\nglobalWhiteRemoteAddresses:\n", "dataVersion: [{counter: 1}]\n"):
        config = parse_acl(text)
        assert config.accounts == {} and config.global_white == ()
        v = AclValidator(config)
        assert refused(v, 28, signed({})) == "No acl config for RocketMQ"


def account(**fields) -> str:
    base = {"accessKey": "goodKey1", "secretKey": "goodSecret1"}
    base.update(fields)
    lines = [f"  {k}: {v}" for k, v in base.items() if v is not ...]
    return "accounts:\n-" + "\n".join(lines)[1:] + "\n"


BAD = [
    (account(accessKey=...), r"accounts\[0\]: accessKey is missing"),
    (account(secretKey=...), r"accounts\[0\] \(accessKey goodKey1\): secretKey is missing"),
    (account(accessKey="abcdef"), r"accounts\[0\]: accessKey must be longer than 6 characters, it has 6"),
    (account(secretKey="12345"), r"\(accessKey goodKey1\): secretKey must be longer than 6 characters, it has 5"),
    (account(secretKey="123456"), r"secretKey must be longer than 6"),
    (account(secretKey="01234567"), r"secretKey '01234567' is read by YAML as the number 342391; quote it"),
    (account(secretKey="1_234_567"), r"secretKey '1_234_567' is read by YAML as the number 1234567"),
    (account(secretKey="12345.678"), r"secretKey must be a string, got a number; quote it"),
    (account(secretKey="true"), r"secretKey must be a string, got a boolean"),
    (account(accessKey="[a, b]"), r"accessKey must be a string, got a list"),
    (account(defaultTopicPerm="ANY"), r"\(accessKey goodKey1\): defaultTopicPerm: 'ANY' is not a permission"),
    (account(defaultGroupPerm="READ"), r"defaultGroupPerm: 'READ' is not a permission"),
    (account(topicPerms="[topicA=ANY]"), r"topicPerms\[0\]: 'ANY' is not a permission"),
    (account(topicPerms="[topicA=PUB, topicB]"), r"topicPerms\[1\]: 'topicB' is not 'name=PERM'"),
    (account(groupPerms="['=SUB']"), r"groupPerms\[0\]: '=SUB' is not 'name=PERM'"),
    (account(groupPerms="[g=PUB=SUB]"), r"groupPerms\[0\]: 'g=PUB=SUB' is not 'name=PERM'"),
    (account(groupPerms="g=SUB"), r"groupPerms must be a list"),
    (account(topicPerms="[{topicA: PUB}]"), r"topicPerms\[0\]: must be a string 'name=PERM', got a mapping"),
    (account(admin="maybe"), r"admin must be true or false"),
    (account(whiteRemoteAddress="[1.2.3.4]"), r"whiteRemoteAddress: must be a string, got a list"),
    ("accounts:\n- {accessKey: sameKey1, secretKey: secret11}\n- {accessKey: sameKey1, secretKey: secret22}\n",
     r"accounts\[1\]: accessKey 'sameKey1' is already the accessKey of accounts\[0\]"),
    ("accounts: {accessKey: goodKey1}\n", r"accounts must be a list, got a mapping"),
    ("accounts:\n- just-a-string\n", r"accounts\[0\]: an account must be a mapping"),
    ("globalWhiteRemoteAddresses: 10.0.0.*\n", r"globalWhiteRemoteAddresses must be a list"),
    ("- accessKey: goodKey1\n", r"the file must be a mapping"),
    ("accounts: [\n", r"not valid YAML"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_config_errors(text, message):
    with pytest.raises(AclConfigError, match=message) as info:
        parse_acl(text, "conf/plain_acl.yml")
    assert str(info.value).startswith("conf/plain_acl.yml: ")
    assert "goodSecret1" not in str(info.value)


def test_good_variants_load():
    config = parse_acl(account(accessKey="abcdefg", secretKey='"0123456"', admin='"TRUE"',
                               whiteRemoteAddress="'192.168.1.{1,2}'", topicPerms="[t=SUB|PUB]"))
    a = config.accounts["abcdefg"]
    assert a.secret_key == "0123456" and a.admin and a.resource_perms == {"t": PUB | SUB}


def test_field_values_that_are_not_strings_are_signed_as_java_writes_them():
    """A SmartGo msgpack header may carry numbers and booleans; the content is what Java's
    StringBuilder.append would make of the decoded values, and nothing raises."""
    assert request_content({"b": 7, "a": True, "c": None}, b"!") == b"true7null!"
    fields = {"queueId": 3, "topic": "T"}
    added = sign(fields, None, "ak-123456", "sk-1234567")
    assert added["Signature"] == sign({"queueId": "3", "topic": "T"}, None, "ak-123456", "sk-1234567")["Signature"]
