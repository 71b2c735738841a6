"""A node started under a low soft open-files limit raises it for its actors: one mapped file holds
one descriptor, and a topic with more queues than the default limit crashed dispatch with EMFILE.
Under a low hard limit, sends that would open more queues than the descriptors allow are refused."""

from __future__ import annotations

import resource

import psutil
import pytest

from smartgo.actors.testing import ROOT
from smartgo.broker.testing import pull_command, send_command, start_broker
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import ResponseCode
from smartgo.testing import wait_until

SOFT = 256
QUEUES = 400



def launcher(tmp_path, limits: str):
    """A supervisor that sets RLIMIT_NOFILE to `limits` (Python for a (soft, hard) pair) first."""
    path = tmp_path / "low_limit_supervisor.py"
    path.write_text(f"""
import resource, sys
sys.path.insert(0, {str(ROOT)!r})
from smartgo.actors.arbiter import main
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
        log = node.log_text()
        assert "Too many open files" not in log and f"open files limit {raised}" in log
    finally:
        client.close()
        node.reap()


@pytest.mark.timeout(120)
def test_sends_opening_more_queues_than_the_open_files_allow_are_refused(tmp_path):
    """Hard limit 1,536: 768 queues (a quarter, at least 1,024 but at most half, stays for
    connections and other files). Dispatch would have failed with EMFILE past ~1,500 and lost the
    node's consumers."""
    node = start_broker(tmp_path / "node", {"topics": "Wide:800"}, launcher=launcher(tmp_path, "(1536, 1536)"))
    client = BlockingRemotingClient()
    addr = f"127.0.0.1:{node.port}"
    try:
        codes = [client.invoke(addr, send_command("Wide", b"q%d" % q, queue_id=q), 5).code for q in range(800)]
        assert codes == [ResponseCode.SUCCESS] * 768 + [ResponseCode.SYSTEM_ERROR] * 32
        wait_until(lambda: client.invoke(addr, pull_command("Wide", 767, 0), 5).code == ResponseCode.SUCCESS,
                   timeout=30, message="the 768th queue's message")
        assert node.health()["node"]["queue_limit"] == 768 and node.actor("dispatch")["restarts"] == 0
        assert "sends may open 768 queues, fewer than the board's queue table holds (49152): the open files limit " \
               "is 1536" in node.log_text()
    finally:
        client.close()
        node.reap()
