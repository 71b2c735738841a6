"""A slave that fell behind its master's retention starts over as a copy of it (a 4.x slave
stalls for good), and one pointed at another log keeps its store (smartgo.broker.ha.reseed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartgo.broker.recovery import load as recovered
from smartgo.broker.recovery import recover_broker
from smartgo.broker.ha.reseed import REQUEST_FILE, Reseed, done, pending, request
from smartgo.broker.settings import store_config
from tests.support.broker import restart_broker
from smartgo.config import NodeConfig
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store import CommitLogWriter, StoreConfig
from smartgo.store.cleanup import empty_store
from smartgo.store.mapped_file import segment_starts
from tests.support.waits import steady_disk_usage, wait_until
from tests.broker.test_replication import caught_up, commitlog_bytes, field, send_many

pytestmark = pytest.mark.timeout(120)

FORCE_CLEAN = "0.87"        # over disk_force_clean_ratio (85 %), under disk_full_ratio: all but the newest file go


def queue_max(client, node, topic: str, queue_id: int) -> int:
    r = client.invoke(f"127.0.0.1:{node.port}", RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={
        "topic": topic, "queueId": str(queue_id)}), 5.0)
    assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    return int(r.ext_fields["offset"])


def drop_old_files(master, usage: Path) -> int:
    """Make the master's cleanup delete every CommitLog file but the newest; returns its new minimum."""
    usage.write_text(f"{FORCE_CLEAN}\n")
    newest = segment_starts(master.node.store / "commitlog")[-1]
    wait_until(lambda: field(master.node, "commitlog.min") == newest, timeout=20, message="the old files to go")
    usage.write_text("0.1\n")
    return newest


def test_a_slave_behind_the_masters_oldest_file_starts_over_as_its_copy(tmp_path, start_node, slaves):
    usage = Path(steady_disk_usage(tmp_path / "master.usage"))
    master = start_node({"topics": "Rep:4", "disk_usage_file": str(usage)})
    send_many(master, "Rep", 600, 1000)                             # ~0.65 MB, in the first file
    slave = slaves(master.node)
    stopped_at = caught_up(master.node, slave)
    slave.stop()
    send_many(master, "Rep", 3000, 1000, start=600)                 # three more files; then all but the last go
    oldest = drop_old_files(master, usage)
    assert oldest > stopped_at

    slave = restart_broker(slave, role="slave")
    slaves.made.append(slave)
    end = caught_up(master.node, slave)
    slave.logged(f"its oldest file starts at {oldest}, this slave ends at {stopped_at}",
                 "store emptied: 1 CommitLog files", f"empty slave: the master's CommitLog starts at {oldest}")
    assert segment_starts(slave.store / "commitlog")[0] == oldest
    assert commitlog_bytes(slave.store, end, start=oldest) == commitlog_bytes(master.node.store, end, start=oldest)
    wait_until(lambda: field(slave, "commitlog.dispatched") == end, timeout=10)
    assert pending(slave.store) is None and not (slave.store / REQUEST_FILE).exists()
    for q in range(4):                                              # its queues go on at the master's offsets
        assert queue_max(master.client, slave, "Rep", q) == queue_max(master.client, master.node, "Rep", q) == 900
    send_many(master, "Rep", 8, 1000, start=3600)                   # and it keeps following
    caught_up(master.node, slave)
    assert queue_max(master.client, slave, "Rep", 0) == 902
    assert slave.health()["healthy"]


def test_a_slave_pointed_at_another_log_keeps_its_store(tmp_path, start_node, slaves):
    """The other master's oldest file starts past the slave's end too, but its oldest record is
    older than the slave's newest: not the log the slave copied, so nothing is emptied."""
    usage = Path(steady_disk_usage(tmp_path / "other.usage"))
    other = start_node({"topics": "Rep:4", "disk_usage_file": str(usage)})
    send_many(other, "Rep", 2400, 1000)                             # written before the slave's data
    master = start_node({"topics": "Rep:4"})
    send_many(master, "Rep", 300, 1000)
    slave = slaves(master.node)
    end = caught_up(master.node, slave)
    slave.stop()
    before = commitlog_bytes(slave.store, end)
    assert drop_old_files(other, usage) > end

    config = slave.store.with_name(slave.store.name + ".toml")
    config.write_text(config.read_text() + f'ha_master_address = "127.0.0.1:{other.node.ha_port}"\n')
    slave = restart_broker(slave, role="slave")
    slaves.made.append(slave)
    wait_until(lambda: "not the log this slave copied" in slave.log_text(), timeout=20,
               message="the slave to refuse the other log")
    assert "starting over" not in slave.log_text()
    assert field(slave, "commitlog.written") == end
    assert commitlog_bytes(slave.store, end) == before
    assert pending(slave.store) is None
    assert slave.health()["healthy"]


def test_empty_store_keeps_config_and_takes_the_data(tmp_path):
    cfg = StoreConfig(store_path=str(tmp_path / "store"), commitlog_file_size=4096)
    for path in (cfg.commitlog_dir / f"{0:020d}", cfg.commitlog_dir / f"{4096:020d}",
                 cfg.consume_queue_dir / "T" / "0" / f"{0:020d}", cfg.index_dir / "20261124000000000",
                 cfg.checkpoint_path, cfg.abort_path, cfg.root / "damaged" / "found.jsonl",
                 cfg.root / "config" / "consumerOffset.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 100)
    assert empty_store(cfg) == (2, 200)
    assert segment_starts(cfg.commitlog_dir) == []
    for gone in (cfg.consume_queue_dir, cfg.index_dir, cfg.checkpoint_path, cfg.abort_path,
                 cfg.root / "damaged" / "found.jsonl"):
        assert not gone.exists(), gone
    assert (cfg.root / "config" / "consumerOffset.json").read_bytes() == b"x" * 100


def test_a_reseed_request_survives_until_done_and_a_corrupt_one_is_ignored(tmp_path):
    request(tmp_path, Reseed("127.0.0.1:10912", 3 << 20, 5000))
    assert pending(tmp_path) == Reseed("127.0.0.1:10912", 3 << 20, 5000)
    done(tmp_path)
    assert pending(tmp_path) is None and not list((tmp_path / "config").iterdir())
    (tmp_path / REQUEST_FILE).write_text('{"master": 1}')
    assert pending(tmp_path) is None


def test_recovery_carries_out_a_pending_request_before_it_recovers(tmp_path):
    node = NodeConfig(role="slave", broker_id=1, store_dir=str(tmp_path / "store"), commitlog_file_size=4096)
    cfg = store_config(node)
    CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, 0, {}).close()
    request(cfg.store_path, Reseed("127.0.0.1:10912", 8192, 100))
    node.run_path.mkdir(parents=True)
    recover_broker(node)
    assert segment_starts(cfg.commitlog_dir) == [] and pending(cfg.store_path) is None
    assert recovered(node.run_path).written == 0
