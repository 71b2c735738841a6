"""The plain_acl.yml edits behind the ACL admin requests: 4.x's field semantics, the dataVersion
bump, refusals that leave the text alone, and the header codec the admin client sends."""

from __future__ import annotations

import pytest
import yaml

from smartgo.broker.acl import acl_file
from smartgo.broker.acl.acl_file import AclEditError
from smartgo.common.acl_check import AclConfigError, parse_acl
from smartgo.common.acl_sign import AccessConfig, split_list

pytestmark = pytest.mark.timeout(30)

ACL = """# edited by hand, in flow style
globalWhiteRemoteAddresses: [10.10.103.*]
accounts:
  - {accessKey: app-access, secretKey: app-secret-1, whiteRemoteAddress: null, admin: false,
     defaultTopicPerm: DENY, defaultGroupPerm: SUB, topicPerms: [Orders=PUB|SUB], groupPerms: [Blocked=DENY]}
  - {accessKey: ops-access, secretKey: 12345678, admin: true}
dataVersion: [{counter: 7, timestamp: 1700000000000}]
"""


def accounts(text: str) -> dict[str, dict]:
    return {str(a["accessKey"]): a for a in yaml.safe_load(text)["accounts"]}


def test_a_new_account_is_appended_in_4x_field_order_and_the_version_bumps():
    out = acl_file.update_account(ACL, AccessConfig("new-access", "new-secret-1", topic_perms=["A=PUB", "B=SUB"]),
                                  "f", 1800000000000)
    doc = yaml.safe_load(out)
    new = doc["accounts"][-1]
    assert list(new) == ["accessKey", "secretKey", "admin", "topicPerms"]
    assert new == {"accessKey": "new-access", "secretKey": "new-secret-1", "admin": False, "topicPerms": ["A=PUB", "B=SUB"]}
    assert doc["dataVersion"] == [{"counter": 8, "timestamp": 1800000000000}]
    assert acl_file.data_version(doc, 0) == (8, 1800000000000)
    config = parse_acl(out)
    assert set(config.accounts) == {"app-access", "ops-access", "new-access"}
    assert config.accounts["ops-access"].secret_key == "12345678"       # a YAML number stays one
    assert "# edited by hand" not in out                                 # comments go, as with 4.x


def test_an_existing_account_changes_only_the_fields_given():
    out = acl_file.update_account(ACL, AccessConfig("app-access", topic_perms=[], default_topic_perm="PUB"), "f", 5)
    app = accounts(out)["app-access"]
    assert app["secretKey"] == "app-secret-1" and app["admin"] is False and app["groupPerms"] == ["Blocked=DENY"]
    assert app["topicPerms"] == [] and app["defaultTopicPerm"] == "PUB"
    assert list(accounts(out)) == ["app-access", "ops-access"]           # changed in place
    # admin left out keeps it (4.x: left out meant false)
    out = acl_file.update_account(out, AccessConfig("ops-access", white_remote_address="192.168.1.*"), "f", 6)
    assert accounts(out)["ops-access"]["admin"] is True
    out = acl_file.update_account(out, AccessConfig("ops-access", admin=False), "f", 7)
    assert accounts(out)["ops-access"]["admin"] is False
    assert acl_file.data_version(yaml.safe_load(out), 0) == (10, 7)


@pytest.mark.parametrize("change, reason", [
    (AccessConfig("short", "long-enough"), "cannot be null and length should longer than 6"),
    (AccessConfig("new-access"), "a new account needs a secretKey"),
    (AccessConfig("new-access", "short"), "secretKey must be longer than 6"),
    (AccessConfig("app-access", default_topic_perm="ALL"), "'ALL' is not a permission"),
    (AccessConfig("app-access", topic_perms=["Orders"]), "is not 'name=PERM'"),
    (AccessConfig("app-access", white_remote_address="192.168.999.*"), "whiteRemoteAddress"),
])
def test_a_change_the_broker_could_not_load_is_refused_with_the_reason(change, reason):
    with pytest.raises((AclEditError, AclConfigError), match=reason):
        acl_file.update_account(ACL, change, "plain_acl.yml", 1)


def test_delete_and_the_global_white_list():
    out = acl_file.delete_account(ACL, "app-access", "f", 1)
    assert list(accounts(out)) == ["ops-access"]
    with pytest.raises(AclEditError, match="has no account with accessKey 'app-access'"):
        acl_file.delete_account(out, "app-access", "f", 2)
    out = acl_file.set_global_white(out, ["*", "192.168.0.1-9"], "f", 3)
    assert yaml.safe_load(out)["globalWhiteRemoteAddresses"] == ["*", "192.168.0.1-9"]
    assert len(parse_acl(out).global_white) == 2
    out = acl_file.set_global_white(out, [], "f", 4)
    assert parse_acl(out).global_white == () and acl_file.data_version(yaml.safe_load(out), 0) == (10, 4)
    with pytest.raises(AclConfigError, match="globalWhiteRemoteAddresses"):
        acl_file.set_global_white(out, ["10.1.1.300"], "f", 5)


@pytest.mark.parametrize("text", ["", "# nothing yet\n"])
def test_an_empty_or_missing_file_takes_a_first_account(text):
    out = acl_file.update_account(text, AccessConfig("first-access", "first-secret", admin=True), "f", 9)
    assert parse_acl(out).accounts["first-access"].admin
    assert acl_file.data_version(yaml.safe_load(out), 0) == (1, 9)


@pytest.mark.parametrize("text, reason", [("accounts: [unclosed\n", "not valid YAML"), ("- a list\n", "not a mapping"),
                                          ("accounts: 3\n", "accounts is not a list")])
def test_a_file_that_is_not_an_acl_file_is_left_alone(text, reason):
    with pytest.raises(AclEditError, match=reason):
        acl_file.update_account(text, AccessConfig("first-access", "first-secret"), "f", 1)


def test_data_version_without_one_or_with_a_bad_one():
    assert acl_file.data_version({}, 42) == (0, 42)
    assert acl_file.data_version({"dataVersion": [{"counter": "x"}]}, 42) == (0, 42)
    assert acl_file.data_version({"dataVersion": "3"}, 42) == (0, 42)


def test_config_body_is_4x_shape_with_nulls_left_out():
    body = acl_file.config_body(ACL, "f")
    assert body["globalWhiteAddrs"] == ["10.10.103.*"]
    app, ops = body["plainAccessConfigs"]
    assert app == {"accessKey": "app-access", "admin": False, "defaultGroupPerm": "SUB", "defaultTopicPerm": "DENY",
                   "groupPerms": ["Blocked=DENY"], "secretKey": "app-secret-1", "topicPerms": ["Orders=PUB|SUB"]}
    assert list(app) == sorted(app)
    assert ops == {"accessKey": "ops-access", "admin": True, "secretKey": "12345678"}
    with pytest.raises(AclConfigError):
        acl_file.config_body("accounts: [ {accessKey: short} ]\n", "f")


def test_access_config_header_round_trip():
    change = AccessConfig("app-access", "app-secret-1", "10.0.0.*", False, "PUB", "SUB", ["A=PUB", "B=SUB"], [])
    header = change.to_header()
    assert header == {"accessKey": "app-access", "secretKey": "app-secret-1", "whiteRemoteAddress": "10.0.0.*",
                      "admin": "false", "defaultTopicPerm": "PUB", "defaultGroupPerm": "SUB",
                      "topicPerms": "A=PUB,B=SUB", "groupPerms": ""}
    assert AccessConfig.from_header(header) == change
    assert AccessConfig.from_header({"accessKey": "a-access"}) == AccessConfig("a-access")
    assert "app-secret-1" not in repr(change)
    assert split_list(" a=PUB , ,b=SUB,") == ["a=PUB", "b=SUB"] and split_list(None) is None
