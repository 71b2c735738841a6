"""A node started under a low soft open-files limit raises it for its actors: one mapped file holds
one descriptor, and a topic with more queues than the default limit crashed dispatch with EMFILE.
Under a low hard limit actors keep fewer files mapped, and every queue is still served."""

from __future__ import annotations

import resource

import psutil
import pytest

from tests.support.nodes import ROOT
from tests.support.broker import pull_command, send_command, start_broker
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import ResponseCode
from smartgo.store.record import decode_records
from tests.support.waits import wait_until

SOFT = 256
QUEUES = 400



def launcher(tmp_path, limits: str):
    """A supervisor that sets RLIMIT_NOFILE to `limits` (Python for a (soft, hard) pair) first."""
    path = tmp_path / "low_limit_supervisor.py"
    path.write_text(f"""
import resource, sys
sys.path.insert(0, {str(ROOT)!r})
from smartgo.node import main
if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, {limits})
    sys.exit(main())
""")
    return path


@pytest.mark.timeout(120)
def test_a_topic_with_more_queues_than_the_soft_limit_is_served(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard == resource.RLIM_INFINITY or hard >= 4 * QUEUES, f"needs a hard open-files limit of {4 * QUEUES}"
    low_soft = launcher(tmp_path, f"({SOFT}, resource.getrlimit(resource.RLIMIT_NOFILE)[1])")
    node = start_broker(tmp_path / "node", {"topics": f"Wide:{QUEUES}"}, launcher=low_soft)
    client = BlockingRemotingClient()
    addr = f"127.0.0.1:{node.port}"
    try:
        raised = hard if hard != resource.RLIM_INFINITY else 1 << 20
        for name in ("dispatch", "net-0", "flush"):
            assert psutil.Process(node.actor(name)["pid"]).rlimit(psutil.RLIMIT_NOFILE)[0] == raised, name
        for q in range(QUEUES):
            assert client.invoke(addr, send_command("Wide", b"q%d" % q, queue_id=q), 5).code == ResponseCode.SUCCESS
        missing = list(range(QUEUES))

        def all_pulled() -> bool:
            missing[:] = [q for q in missing
                          if client.invoke(addr, pull_command("Wide", q, 0), 5).code != ResponseCode.SUCCESS]
            return not missing
        wait_until(all_pulled, timeout=30, message="every queue's message")
        assert node.actor("dispatch")["restarts"] == 0
        assert "Too many open files" not in node.logged(f"open files limit {raised}")
    finally:
        client.close()
        node.reap()


@pytest.mark.timeout(180)
def test_more_queues_than_the_open_files_allow_are_all_served(tmp_path):
    """Hard limit 1,536: each actor keeps at most 768 ConsumeQueue files mapped (a quarter, at least
    1,024 but at most half, stays for connections and other files) and maps the others again as they
    come back. Before, dispatch failed with EMFILE past ~1,500 queues and lost the node's consumers;
    then sends past 768 queues were refused."""
    node = start_broker(tmp_path / "node", {"topics": "WideA:1000,WideB:1000"},
                        launcher=launcher(tmp_path, "(1536, 1536)"))
    client = BlockingRemotingClient()
    addr = f"127.0.0.1:{node.port}"
    queues = [(t, q) for t in ("WideA", "WideB") for q in range(1000)]
    try:
        for rnd in range(2):
            codes = {client.invoke(addr, send_command(t, b"%s %d %d" % (t.encode(), q, rnd), queue_id=q), 5).code
                     for t, q in queues}
            assert codes == {ResponseCode.SUCCESS}
        missing = list(queues)

        def second(t: str, q: int) -> bytes | None:
            r = client.invoke(addr, pull_command(t, q, 1), 5)
            return decode_records(r.body_bytes())[0].body if r.code == ResponseCode.SUCCESS else None

        def all_pulled() -> bool:
            missing[:] = [(t, q) for t, q in missing if second(t, q) != b"%s %d 1" % (t.encode(), q)]
            return not missing
        wait_until(all_pulled, timeout=60, message="every queue's second message")
        assert node.health()["node"]["queue_limit"] == 49152
        for name in ("dispatch", "net-0", "flush"):
            actor = node.actor(name)
            assert actor["restarts"] == 0 and psutil.Process(actor["pid"]).num_fds() < 1536 - 512, name
        assert "Too many open files" not in node.log_text()
    finally:
        client.close()
        node.reap()
