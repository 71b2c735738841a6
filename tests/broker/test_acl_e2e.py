"""A node with acl_enable against signed and unsigned clients: refusals with 4.x's texts while the
connection goes on serving, permissions per topic and group, admin codes, the Python SDK with
credentials end to end, the file read again when it changes, and a bad file at start."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from tests.support.nodes import NodeStartError
from tests.support.broker import pull_command, send_command, start_broker
from smartgo.client import AccessConfig, Admin, AsyncProducer, AsyncPushConsumer, BrokerError, Message
from smartgo.common.acl_sign import signer
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.loop import run
from tests.support.waits import async_wait_until, wait_until

pytestmark = pytest.mark.timeout(90)

ACL = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: app-access
    secretKey: app-secret-1
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Orders=PUB|SUB
      - Audit=SUB
    groupPerms:
      - Blocked=DENY
  - accessKey: ops-access
    secretKey: ops-secret-1
    admin: true
"""


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("acl")
    acl = base / "plain_acl.yml"
    acl.write_text(ACL)
    n = start_broker(base / "node", {"acl_enable": "true", "acl_file": str(acl)})
    n.acl_file = acl                                      # type: ignore[attr-defined]
    yield n
    n.reap()


def client(access_key: str | None = None, secret_key: str = "") -> BlockingRemotingClient:
    return BlockingRemotingClient(request_hook=signer(access_key or "", secret_key))


def call(c: BlockingRemotingClient, node, cmd: RemotingCommand) -> RemotingCommand:
    return c.invoke(f"127.0.0.1:{node.port}", cmd, 5.0)


def test_unsigned_and_wrongly_signed_requests_are_refused_and_the_connection_serves_on(node):
    plain, wrong, app = client(), client("app-access", "not-the-secret"), client("app-access", "app-secret-1")
    stranger = client("nobody-access", "whatever-1")
    try:
        r = call(plain, node, send_command("Orders", b"x"))
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "No accessKey is configured")
        r = call(wrong, node, send_command("Orders", b"x"))
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "Check signature failed for accessKey=app-access")
        r = call(stranger, node, send_command("Orders", b"x"))
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "No acl config for nobody-access")
        assert call(app, node, send_command("Orders", b"signed")).code == ResponseCode.SUCCESS
        # a refused connection is still open: the next request gets its answer too
        assert call(plain, node, RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={
            "topic": "Orders", "queueId": "0"})).remark == "No accessKey is configured"
    finally:
        for c in (plain, wrong, app, stranger):
            c.close()
    assert "refused by the ACL" in wait_until(lambda: _log(node, "refused by the ACL"), message="the log line")


def _log(node, text: str) -> str | None:
    logs = "".join(p.read_text(errors="replace") for p in Path(node.store, "logs").glob("*.log"))
    return logs if text in logs else None


def test_topic_group_and_admin_permissions(node):
    app, ops = client("app-access", "app-secret-1"), client("ops-access", "ops-secret-1")
    try:
        assert call(app, node, send_command("Orders", b"ok")).code == ResponseCode.SUCCESS
        audit = call(app, node, send_command("Audit", b"x"))           # SUB only
        assert (audit.code, audit.remark) == (ResponseCode.SYSTEM_ERROR, "No default permission for topic:Audit")
        other = call(app, node, send_command(uid("Other"), b"x"))       # default DENY
        assert other.code == ResponseCode.SYSTEM_ERROR and other.remark.startswith("No default permission for topic:")
        wait_until(lambda: call(app, node, pull_command("Orders", 0, 0, group="Readers")).code
                   == ResponseCode.SUCCESS, message="a pull as group Readers (default SUB)")
        blocked = call(app, node, pull_command("Orders", 0, 0, group="Blocked"))
        assert (blocked.code, blocked.remark) == (ResponseCode.SYSTEM_ERROR, "No default permission for group:Blocked")
        create = RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields={
            "topic": uid("Made"), "defaultTopic": "TBW102", "readQueueNums": "1", "writeQueueNums": "1",
            "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})
        refused = call(app, node, create)
        assert refused.remark == "Need admin permission for request code=17, but accessKey=app-access is not"
        assert call(ops, node, create).code == ResponseCode.SUCCESS                 # the admin account
        assert call(ops, node, send_command(uid("Anything"), b"x")).code == ResponseCode.SUCCESS
    finally:
        app.close()
        ops.close()


def test_the_sdk_signs_every_request_it_makes(node):
    """Producer, push consumer (heartbeats, consumer list, offsets, pulls, unregister) with the
    account's keys; the same producer with a wrong secret fails with the broker's reason."""
    registry = f"127.0.0.1:{node.registry_port}"
    keys = {"access_key": "app-access", "secret_key": "app-secret-1"}

    async def main():
        async with AsyncProducer("PG", registry, **keys) as p:
            sent = {(await p.send(Message("Orders", b"sdk-%d" % i))).msg_id for i in range(10)}
        got = set()
        c = AsyncPushConsumer("SdkReaders", registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                              listener=lambda m: got.add(m.uniq_key), **keys)
        c.subscribe("Orders")
        async with c:
            await async_wait_until(lambda: sent <= got, 30, 0.05, "the signed consumer's messages")
        async with AsyncProducer("PG", registry, access_key="app-access", secret_key="wrong-secret") as p:
            with pytest.raises(BrokerError, match="Check signature failed for accessKey=app-access"):
                await p.send(Message("Orders", b"refused"))
        return sent, got
    sent, got = run(main())
    assert sent <= got


def test_the_admin_clients_resend_and_cleanups_need_and_carry_the_admins_keys(node):
    """dlq-resend's producer signs with the admin's keys (it sent unsigned once); the deletions asked
    for now (306, 329) are admin codes."""
    registry, addr = f"127.0.0.1:{node.registry_port}", f"127.0.0.1:{node.port}"
    group, back = uid("Dead"), uid("Back")
    ops = client("ops-access", "ops-secret-1")
    try:
        dead = call(ops, node, send_command(f"%DLQ%{group}", b"dead letter"))
        assert dead.code == ResponseCode.SUCCESS
    finally:
        ops.close()
    with Admin(registry, access_key="app-access", secret_key="app-secret-1") as app_admin:
        with pytest.raises(BrokerError, match="Need admin permission for request code=329"):
            app_admin.delete_expired_commitlog(broker_addr=addr)
        with pytest.raises(BrokerError, match="Need admin permission for request code=306"):
            app_admin.clean_expired_consume_queue(broker_addr=addr)
    with Admin(registry, access_key="ops-access", secret_key="ops-secret-1") as admin:
        [(message, new_id)] = admin.dlq_resend(group, to_topic=back)
        assert message.body == b"dead letter"
        resent = admin.view_message(new_id)                 # the copy, stored under the resend's topic
        assert (resent.topic, resent.body) == (back, b"dead letter")
        assert admin.delete_expired_commitlog(broker_addr=addr) == {addr: 0}
        assert admin.clean_expired_consume_queue(broker_addr=addr) == {addr: 0}


def test_a_changed_file_applies_and_a_broken_one_keeps_the_rules(node):
    app = client("app-access", "app-secret-1")
    topic = uid("Later")
    try:
        assert call(app, node, send_command(topic, b"x")).code == ResponseCode.SYSTEM_ERROR
        node.acl_file.write_text(ACL.replace("      - Audit=SUB", f"      - Audit=SUB\n      - {topic}=PUB"))
        wait_until(lambda: call(app, node, send_command(topic, b"x")).code == ResponseCode.SUCCESS, timeout=15,
                   message="the new rule")
        node.acl_file.write_text("accounts: [ {accessKey: short} ]\n")
        assert wait_until(lambda: _log(node, "does not load; the rules in force stay"), timeout=15)
        assert call(app, node, send_command(topic, b"y")).code == ResponseCode.SUCCESS
    finally:
        node.acl_file.write_text(ACL)
        app.close()


def test_acl_admin_requests_rewrite_the_file_and_apply_at_once(node, capsys):
    """50-54 through the admin client and the CLI: admin accounts only; each change is in force
    for the next request, with no wait for the file watcher; a change the broker could not load is
    refused with the reason and leaves the file alone; the version counts the changes."""
    from smartgo.cli.main import main
    registry, addr = f"127.0.0.1:{node.registry_port}", f"127.0.0.1:{node.port}"
    path = str(node.acl_file.resolve())
    topic = uid("Granted")
    newbie, anonymous = client("newbie-access", "newbie-secret"), client()
    try:
        with Admin(registry, access_key="app-access", secret_key="app-secret-1") as app_admin:
            with pytest.raises(BrokerError, match="Need admin permission for request code=50"):
                app_admin.update_acl_account(AccessConfig("newbie-access", "newbie-secret"), broker_addr=addr)
            with pytest.raises(BrokerError, match="Need admin permission for request code=54"):
                app_admin.acl_config(addr)
        with Admin(registry, access_key="ops-access", secret_key="ops-secret-1") as admin:
            [before] = admin.acl_versions()                       # every broker of every cluster: this one
            assert (before.broker_addr, list(before.files)) == (addr, [path])
            counter = before.files[path][0]
            assert call(newbie, node, send_command(topic, b"x")).remark == "No acl config for newbie-access"

            assert admin.update_acl_account(AccessConfig("newbie-access", "newbie-secret",
                                                         topic_perms=[f"{topic}=PUB"])) == [addr]
            assert call(newbie, node, send_command(topic, b"x")).code == ResponseCode.SUCCESS

            text = node.acl_file.read_text()
            with pytest.raises(BrokerError, match="'ALL' is not a permission") as refused:
                admin.update_acl_account(AccessConfig("newbie-access", default_topic_perm="ALL"), broker_addr=addr)
            assert refused.value.code == ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
            assert node.acl_file.read_text() == text

            admin.update_acl_account(AccessConfig("newbie-access", topic_perms=[f"{topic}=SUB"]), broker_addr=addr)
            assert call(newbie, node, send_command(topic, b"x")).remark == f"No default permission for topic:{topic}"

            admin.update_global_white_addrs(["127.0.0.1"], broker_addr=addr)
            assert call(anonymous, node, send_command(topic, b"x")).code == ResponseCode.SUCCESS
            admin.update_global_white_addrs([], broker_addr=addr)
            assert call(anonymous, node, send_command(topic, b"x")).remark == "No accessKey is configured"

            config = admin.acl_config(addr)
            assert config["globalWhiteAddrs"] == []
            assert {"accessKey": "newbie-access", "admin": False, "secretKey": "newbie-secret",
                    "topicPerms": [f"{topic}=SUB"]} in config["plainAccessConfigs"]

            admin.delete_acl_account("newbie-access", broker_addr=addr)
            assert call(newbie, node, send_command(topic, b"x")).remark == "No acl config for newbie-access"
            with pytest.raises(BrokerError, match="has no account with accessKey 'newbie-access'") as gone:
                admin.delete_acl_account("newbie-access", broker_addr=addr)
            assert gone.value.code == ResponseCode.DELETE_ACL_CONFIG_FAILED
            [after] = admin.acl_versions(broker_addr=addr)
            assert after.files[path][0] == counter + 5
        assert node.acl_file.with_name("plain_acl.yml.bak").exists()
        assert _log(node, "deletion of ACL account newbie-access by 127.0.0.1")

        ops = ["-n", registry, "--access-key", "ops-access", "--secret-key", "ops-secret-1"]
        assert main(["admin", "acl-version", "--json", *ops]) == 0
        assert json.loads(capsys.readouterr().out)["brokers"][0]["files"][path]["counter"] == counter + 5
        assert main(["admin", "acl-update", *ops, "--account", "cli-access", "--account-secret", "cli-secret",
                     "--topic-perms", f"{topic}=PUB", "--no-admin"]) == 0
        assert f"ACL account cli-access updated on {addr}" in capsys.readouterr().out
        cli_account = client("cli-access", "cli-secret")
        assert call(cli_account, node, send_command(topic, b"x")).code == ResponseCode.SUCCESS
        cli_account.close()
        assert main(["admin", "acl-config", "--broker", addr, *ops]) == 0
        assert "cli-access" in capsys.readouterr().out
        assert main(["admin", "acl-white", "--addrs", "10.9.9.300", *ops]) != 0
        assert "globalWhiteRemoteAddresses[0]: '10.9.9.300': not an IP address" in capsys.readouterr().err
    finally:
        node.acl_file.write_text(ACL)
        wait_until(lambda: call(anonymous, node, send_command(topic, b"x")).remark == "No accessKey is configured"
                   and call(newbie, node, send_command(topic, b"x")).remark == "No acl config for newbie-access",
                   timeout=15, message="the original ACL file back in force")
        newbie.close()
        anonymous.close()


def test_a_node_with_a_bad_acl_file_does_not_start(tmp_path):
    bad = tmp_path / "plain_acl.yml"
    bad.write_text("accounts:\n  - accessKey: app-access\n    secretKey: app-secret-1\n    topicPerms: [Orders=ALL]\n")
    started = time.monotonic()
    with pytest.raises(NodeStartError, match="topicPerms"):
        start_broker(tmp_path / "node", {"acl_enable": "true", "acl_file": str(bad)})
    assert time.monotonic() - started < 60


def test_a_slave_signs_its_copies_from_an_acl_enabled_master(tmp_path):
    """SlaveSynchronize's requests are checked like any others: a slave without credentials is
    refused (and says why in its log), one with acl_access_key / acl_secret_key gets the tables."""
    from tests.support.broker import start_slave
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    master = start_broker(tmp_path / "master", {"acl_enable": "true", "acl_file": str(acl)})
    nodes = [master]
    try:
        ops = client("ops-access", "ops-secret-1")
        topic = uid("Replicated")
        assert call(ops, master, send_command(topic, b"x")).code == ResponseCode.SUCCESS   # auto-created
        ops.close()
        anonymous = start_slave(tmp_path / "anonymous", master)
        nodes.append(anonymous)
        signed = start_slave(tmp_path / "signed", master, {"acl_access_key": "ops-access",
                                                           "acl_secret_key": "ops-secret-1"})
        nodes.append(signed)
        wait_until(lambda: topic in _topics(signed), timeout=30, message="the signed slave's copy of the topics")
        assert wait_until(lambda: _log(anonymous, "No accessKey is configured"), timeout=30)
        assert topic not in _topics(anonymous)
    finally:
        for n in nodes:
            n.reap()


def _topics(node) -> str:
    path = Path(node.store, "config", "topics.json")
    return path.read_text() if path.exists() else ""
