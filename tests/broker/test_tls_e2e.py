"""TLS on a real node (tls_mode, tls_cert_file, tls_key_file, tls_enable): SDK clients and the
`smartgo` command with use_tls / --tls send and consume through a permissive node, plain clients
too; an enforcing node serves only TLS clients, and registers with its own enforcing registry over
TLS; a node whose certificate does not load serves nothing and says why."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.nodes import ROOT, NodeStartError
from tests.support.broker import start_broker
from smartgo.client import AsyncAdmin, AsyncProducer, AsyncPullConsumer, ClientError, Message, PullStatus

from smartgo.net.loop import run as arun
from tests.support.waits import free_port, self_signed_cert, wait_for_port

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return self_signed_cert(tmp_path_factory.mktemp("certs"), "broker")


async def send_and_read(registry: str, topic: str, body: bytes, **options: object) -> list[bytes]:
    async with AsyncProducer("PG_TLS", registry, **options) as p:
        await p.send(Message(topic, body))
    async with AsyncPullConsumer("CG_TLS", registry, **options) as c:
        got = []
        for q in await c.fetch_queues(topic):
            r = await c.pull(q, "*", 0, 32)
            if r.status is PullStatus.FOUND:
                got += [m.body for m in r.messages]
        return got


def test_a_permissive_node_serves_tls_and_plain_clients(tmp_path, cert, capsys):
    from smartgo.cli.main import main
    node = start_broker(tmp_path / "node", {"tls_mode": "permissive", "tls_cert_file": cert[0],
                                            "tls_key_file": cert[1], "topics": "TlsTopic:1"})
    try:
        registry = f"127.0.0.1:{node.registry_port}"
        assert arun(send_and_read(registry, "TlsTopic", b"secret", use_tls=True)) == [b"secret"]
        assert arun(send_and_read(registry, "TlsTopic", b"plain")) == [b"secret", b"plain"]
        assert main(["send", "-n", registry, "--tls", "--tls-ca-file", cert[0], "--topic", "TlsTopic",
                     "--body", "via cli", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["status"] == "SEND_OK"
        node.logged("(TLS permissive)")
        assert main(["health", "--broker", f"127.0.0.1:{node.port}", "--tls", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["healthy"] is True
    finally:
        node.reap()


def test_an_enforcing_node_serves_only_tls_and_registers_over_tls(tmp_path, cert):
    """Enforcing, with client certificates required (signed by the node's own CA: its self-signed
    certificate): the broker registers with its registry showing its certificate, a client with
    one sends and reads, a client without one or without TLS gets nothing."""
    node = start_broker(tmp_path / "node", {"tls_mode": "enforcing", "tls_cert_file": cert[0],
                                            "tls_key_file": cert[1], "tls_need_client_auth": "require",
                                            "tls_trust_cert_file": cert[0], "tls_enable": "true",
                                            "topics": "TlsOnly:1"})
    try:
        registry = f"127.0.0.1:{node.registry_port}"
        # the route comes from the node's own (enforcing) registry: the broker registered there over TLS
        assert arun(send_and_read(registry, "TlsOnly", b"secret", use_tls=True, tls_cert_file=cert[0],
                                  tls_key_file=cert[1], timeout=2.0)) == [b"secret"]
        for options in ({"use_tls": True}, {}):
            with pytest.raises(ClientError):
                arun(send_and_read(registry, "TlsOnly", b"refused", timeout=2.0, **options))
    finally:
        node.reap()


def test_a_node_whose_certificate_does_not_load_serves_nothing(tmp_path):
    started = time.monotonic()
    with pytest.raises(NodeStartError, match="certificate does not load"):
        start_broker(tmp_path / "node", {"tls_mode": "permissive", "tls_cert_file": str(tmp_path / "missing.crt"),
                                         "tls_key_file": str(tmp_path / "missing.key")})
    assert time.monotonic() - started < 60


def test_a_stand_alone_registry_serves_tls(tmp_path, cert):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "smartgo.registry", "--listen-port", str(port), "--store-dir",
                             str(tmp_path / "registry"), "--tls-mode", "enforcing", "--tls-cert-file", cert[0],
                             "--tls-key-file", cert[1]], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port)

        async def clusters(**options: object):
            async with AsyncAdmin(f"127.0.0.1:{port}", timeout=2.0, **options) as admin:
                return (await admin.cluster_info()).clusters
        assert arun(clusters(use_tls=True)) == {}                  # answered over TLS: no broker yet
        with pytest.raises(ClientError):
            arun(clusters())
    finally:
        proc.terminate()
        proc.wait(10)
    bad = subprocess.run([sys.executable, "-m", "smartgo.registry", "--tls-mode", "permissive"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "needs tls_cert_file and tls_key_file" in bad.stderr
