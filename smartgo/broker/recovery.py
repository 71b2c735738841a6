"""The broker role's recovery hook: runs in its own process before any broker actor starts.

store lock check -> a slave's request to start over carried out (smartgo.broker.ha.reseed) ->
smartgo.store.recover() (normal or abnormal, by the abort file) -> the expired queues of deleted
topics removed (smartgo.store.cleanup.delete_dropped_queues) -> abort
file created -> the recovered positions written to <run-dir>/recovered.msgpack, where the
actors' first incarnations of this node life read them (later incarnations follow the board,
which only grows from there), and every queue's end to <run-dir>/queue_ends, which dispatch's
first incarnation takes instead of reading each queue's last file.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import msgpack

from smartgo.broker.ha import failover, reseed
from smartgo.broker.settings import store_config
from smartgo.broker.managers.topics import SYSTEM_TOPICS, default_topics, read_snapshot
from smartgo.config import NodeConfig
from smartgo.net.codes import NO_OFFSET
from smartgo.store import StoreLock, mark_running, queue_ends, recover
from smartgo.store.cleanup import delete_dropped_queues, empty_store
from smartgo.store.consume_queue import list_queues

log = logging.getLogger(__name__)

RECOVERED_FILE = "recovered.msgpack"


@dataclass(frozen=True, slots=True)
class Recovered:
    written: int               # end of the valid CommitLog (= dispatched, as recovery leaves it)
    commitlog_min: int
    last_store_timestamp: int
    abnormal: bool


def recover_broker(config: NodeConfig) -> None:
    """The role's `recover` hook (see smartgo.node.roles)."""
    cfg = store_config(config)
    with StoreLock(cfg.store_path):        # another broker (with another run dir) on this store: refuse
        start_over = reseed.pending(cfg.store_path)
        if start_over is not None:
            log.warning("starting over as a copy of the master at %s: its oldest CommitLog file starts at %d, "
                        "past this slave's end at %d", start_over.master, start_over.master_min, start_over.slave_end)
            empty_store(cfg)
            reseed.done(cfg.store_path)
        cut = failover.current(config).truncate_to
        state = recover(cfg, cut if cut != NO_OFFSET else None)
        _drop_deleted_topics(config, state.commitlog_min)
        mark_running(cfg.store_path)
    save(config.run_path, Recovered(state.written, state.commitlog_min, state.last_store_timestamp, state.abnormal))
    queue_ends.save(config.run_path, state.written, state.queue_offsets)   # dispatch's first incarnation takes them
    log.info("broker store ready: written=%d commitlog_min=%d (%s start)", state.written, state.commitlog_min,
             "abnormal" if state.abnormal else "normal")


def queue_demand(config: NodeConfig) -> int:
    """The role's queue demand hook: the queues in the store (ConsumeQueue directories), which
    dispatch publishes on the board at once, however many topics a previous life created."""
    return len(list_queues(store_config(config).consume_queue_dir))


def _drop_deleted_topics(config: NodeConfig, commitlog_min: int) -> None:
    """The expired queues of topics the broker no longer has (none without its topic table)."""
    snapshot = read_snapshot(config.store_path)
    if snapshot is None:
        return
    keep = {*snapshot.topics, *(t.name for t in default_topics(config)), *SYSTEM_TOPICS}
    dropped = delete_dropped_queues(store_config(config), commitlog_min, keep)
    if dropped:
        log.info("deleted %d queues of deleted topics, every message in them expired: %s", len(dropped),
                 ", ".join(f"{topic}:{qid}" for topic, qid in dropped[:20]) + (", ..." if len(dropped) > 20 else ""))


def save(run_path: Path, rec: Recovered) -> None:
    path = run_path / RECOVERED_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgpack.packb([rec.written, rec.commitlog_min, rec.last_store_timestamp, rec.abnormal]))
    os.replace(tmp, path)


def load(run_path: Path) -> Recovered:
    """What the recovery hook of this node life found (it always runs before the actors)."""
    return Recovered(*msgpack.unpackb((run_path / RECOVERED_FILE).read_bytes()))
