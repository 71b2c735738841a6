"""kill -9 of multiprocessing's helpers of a node (the fork server, the resource tracker) under a
send load: the supervisor replaces each at once, no actor is lost with it, an actor killed next
restarts as usual, and nothing acknowledged is lost."""

from __future__ import annotations

import psutil
import pytest

from tests.support.waits import wait_until
from tests.broker.test_faults import QUEUES, TOPIC, Load, check_exactly_once, kill9, settled, stored_keys

# What each helper runs (`python -c ...`); a fork server's actors keep its command line.
HELPERS = {"forkserver": "from multiprocessing.forkserver import main",
           "tracker": "from multiprocessing.resource_tracker import main"}


def helper_pids(broker) -> dict[str, int]:
    """The supervisor's children running each helper, told from the actors it adopted from a lost
    fork server (they keep its command line) by the actors' pids."""
    report = broker.node.health()
    actors = {a["pid"] for a in report["actors"]}
    found = {}
    for p in psutil.Process(broker.node.proc.pid).children():
        try:
            if p.pid not in actors and p.status() != psutil.STATUS_ZOMBIE:
                found.update({kind: p.pid for kind, cmd in HELPERS.items() if cmd in " ".join(p.cmdline())})
        except psutil.Error:
            pass
    return found


def restarts(broker) -> dict[str, int]:
    return {a["name"]: a["restarts"] for a in broker.node.health()["actors"]}


@pytest.mark.timeout(180)
def test_kill_9_of_the_fork_server_or_the_resource_tracker_then_of_an_actor_under_load(start_node):
    broker = start_node({"topics": f"{TOPIC}:{QUEUES}", "net_actors": 2})
    wait_until(lambda: broker.board("disk.used_permille") == 100, message="the test's own disk usage")
    load = Load(broker.addr)
    load.start()
    try:
        load.wait_progress(100)
        for helper, actor in (("forkserver", "commit"), ("tracker", "net-0")):
            before = restarts(broker)
            old = helper_pids(broker)[helper]
            kill9(old)
            new = wait_until(lambda: (pid := helper_pids(broker).get(helper)) not in (None, old) and pid,
                             timeout=30, message=f"a new {helper}")
            load.wait_progress(30)
            assert restarts(broker) == before, f"actors restarted after the {helper} was killed"
            report = broker.node.wait_healthy(check=lambda r: r["node"][f"{helper}_pid"] == new)
            assert report["node"]["restarts"] == 0

            killed = broker.node.actor(actor)["pid"]
            kill9(killed)
            broker.node.wait_healthy(check=lambda r: next(
                a for a in r["actors"] if a["name"] == actor)["pid"] not in (None, killed))
            load.wait_progress(30)
            assert restarts(broker) == {**before, actor: before[actor] + 1}
    finally:
        load.stop()
    settled(broker)
    check_exactly_once(load, stored_keys(broker))
    broker.node.logged("fork server (pid", "was killed by SIGKILL; starting a new one", "new resource tracker")
