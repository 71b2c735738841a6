"""A registry with acl_enable (4.x's name server has none): its writes need an admin account, a
broker's registration any account's signature, reads stay open; a broker signs its registrations
with its acl_access_key; a single node's embedded registry keeps its own broker registered."""

from __future__ import annotations

import pytest

from tests.support.nodes import launch_node
from smartgo.cli.main import main
from smartgo.client import Admin
from smartgo.common.acl_sign import sign_request
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(90)

ACL = """
accounts:
  - accessKey: ops-access
    secretKey: ops-secret-1
    admin: true
  - accessKey: app-access
    secretKey: app-secret-1
    admin: false
"""


def put_kv(key: str, signed_by: tuple[str, str] | None = None) -> RemotingCommand:
    cmd = RemotingCommand(RequestCode.PUT_KV_CONFIG, ext_fields={"namespace": "ORDER_TOPIC_CONFIG", "key": key,
                                                                 "value": "broker-a:4"})
    if signed_by is not None:
        sign_request(cmd, *signed_by)
    return cmd


def broker_names(registry: str) -> set[str]:
    with Admin(registry) as admin:
        return set(admin.cluster_info().brokers)


@pytest.fixture
def acl_registry(tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    node = launch_node(tmp_path / "registry", {"acl_enable": "true", "acl_file": str(acl)}, role="registry")
    node.addr = f"127.0.0.1:{node.port}"          # type: ignore[attr-defined]
    node.acl_file = acl                           # type: ignore[attr-defined]
    yield node
    node.reap()


def test_an_acl_registry_wants_an_admin_for_its_writes_and_an_account_for_a_registration(acl_registry, start_node,
                                                                                         capsys, monkeypatch):
    reg = acl_registry.addr
    client = BlockingRemotingClient()
    try:
        refused = client.invoke(reg, put_kv("Unsigned"))
        assert (refused.code, refused.remark) == (ResponseCode.SYSTEM_ERROR, "No accessKey is configured")
        refused = client.invoke(reg, put_kv("App", ("app-access", "app-secret-1")))
        assert refused.remark == "Need admin permission for request code=100, but accessKey=app-access is not"
        assert client.invoke(reg, put_kv("Ops", ("ops-access", "ops-secret-1"))).code == ResponseCode.SUCCESS
        # reads stay open: what the admin put, and the routes
        got = client.invoke(reg, RemotingCommand(RequestCode.GET_KV_CONFIG, ext_fields={
            "namespace": "ORDER_TOPIC_CONFIG", "key": "Ops"}))
        assert (got.code, got.ext_fields["value"]) == (ResponseCode.SUCCESS, "broker-a:4")
        missing = client.invoke(reg, RemotingCommand(RequestCode.GET_KV_CONFIG, ext_fields={
            "namespace": "ORDER_TOPIC_CONFIG", "key": "Unsigned"}))
        assert missing.code == ResponseCode.QUERY_NOT_FOUND
        forged = RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields={
            "brokerName": "ghost", "brokerAddr": "127.0.0.1:1", "clusterName": "DefaultCluster", "brokerId": "0"})
        assert client.invoke(reg, forged).remark == "No accessKey is configured"
        # the connection served on through the refusals
        assert client.invoke(reg, RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO)).code == ResponseCode.SUCCESS
        # the file is read again when it changes
        acl_registry.acl_file.write_text(ACL.replace("admin: false", "admin: true"))
        wait_until(lambda: client.invoke(reg, put_kv("App", ("app-access", "app-secret-1"))).code
                   == ResponseCode.SUCCESS, timeout=10, message="app-access made an admin")
    finally:
        client.close()

    signed = start_node({"topics": "Acl:4", "registry": reg, "acl_access_key": "app-access",
                         "acl_secret_key": "app-secret-1"})
    start_node({"topics": "Acl:4", "registry": reg, "broker_name": "broker-b"})
    wait_until(lambda: acl_registry.log_text().count("request code 103 refused by the ACL") >= 1, timeout=20,
               message="broker-b's registration refused")
    assert broker_names(reg) == {"broker-a"}
    assert signed.node.health()["healthy"]

    # the CLI signs with --access-key: refused without, past the ACL with an admin
    assert main(["admin", "elect-master", "-n", reg, "--broker-name", "broker-a"]) != 0
    assert "No accessKey is configured" in capsys.readouterr().err
    monkeypatch.setenv("SMARTGO_SECRET_KEY", "ops-secret-1")
    assert main(["admin", "elect-master", "-n", reg, "--broker-name", "broker-a", "--access-key", "ops-access"]) != 0
    assert "this registry does not decide failover" in capsys.readouterr().err


def test_an_embedded_registry_with_acl_guards_its_writes_and_keeps_its_broker(tmp_path, start_node):
    """A single node with acl_enable and no account of its own: its broker registers with its
    embedded registry unsigned, and a KV write there needs an admin of the node's file."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    node = start_node({"topics": "Solo:4", "acl_enable": "true", "acl_file": str(acl)})
    assert broker_names(node.registry) == {"broker-a"}
    assert node.client.invoke(node.registry, put_kv("Solo")).remark == "No accessKey is configured"
    assert node.client.invoke(node.registry, put_kv("Solo", ("ops-access", "ops-secret-1"))).code == \
        ResponseCode.SUCCESS
