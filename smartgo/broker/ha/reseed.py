"""A slave that fell behind its master's retention starts over (a 4.x slave waits forever).

A slave whose CommitLog ends before the master's oldest file is streamed that file
(smartgo.broker.ha.ha_service): nothing the slave holds is on the master any more, and its log
cannot go on. The ha actor checks that the master's oldest record is not older than its own
newest (else the two are not one log, and a wrong ha_master_address must not empty a store),
records the request in <store>/config/reseed.json and asks the supervisor for a node restart.
Before the next recovery the hook empties the CommitLog, consume queues and index (consumer
offsets and the rest of config/ stay), and the slave copies the master from its oldest file as a
new slave does. A crash in between finds the request again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from smartgo.common.persist import RecordFile

REQUEST_FILE = "config/reseed.json"


@dataclass(frozen=True, slots=True)
class Reseed:
    master: str             # the master's HA address
    master_min: int         # where its oldest CommitLog file starts
    slave_end: int          # where this slave's CommitLog ended


def _file(store_path: str | Path) -> RecordFile[Reseed]:
    return RecordFile(Path(store_path) / REQUEST_FILE, Reseed, "reseed request")


def request(store_path: str | Path, reseed: Reseed) -> None:
    _file(store_path).save(reseed)


def pending(store_path: str | Path) -> Reseed | None:
    return _file(store_path).load()


def done(store_path: str | Path) -> None:
    _file(store_path).delete()
