"""The slave's side of replication (RocketMQ 4.x HAClient), in the ha actor: the only writer of a
slave's CommitLog.

It connects to the master's HA address (ha_master_address, or the haServerAddr the registry
answered the slave's registration with, which the broker actor leaves in <run>/ha_master),
reports its CommitLog position, and appends every frame verbatim at the offset it names. A
frame that does not continue the log ends the connection; the next one starts again from the
position reported then. A frame at the start of a file past the log's end is the master's
oldest file: an empty slave goes on from there, one that held data starts over
(smartgo.broker.ha.reseed).

Frames are cut wherever the master's batch limit falls, so the tail may end inside a record.
The slave publishes commitlog.written only at record ends (walking the record and file-end
headers that arrived): dispatch and readers never see a partial record, and a restart resumes
from a whole record. It reports the raw position, which is what a SYNC_MASTER waits for.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING

from smartgo.actors.logs import Repeats
from smartgo.broker import recovery
from smartgo.broker.ha import reseed
from smartgo.broker.bells import FlagBell
from smartgo.net.ha_codec import HAProtocolError, TransferDecoder, encode_report
from smartgo.net.loop import wait_within
from smartgo.store import CommitLogReader, CommitLogWriter, CorruptRecordError, StoreError
from smartgo.store.mapped_file import segment_name, segment_starts
from smartgo.store.record import MESSAGE_MAGIC, SIZE_MAGIC, store_timestamp_at

if TYPE_CHECKING:
    from smartgo.broker.actors.ha_actor import HAActor

log = logging.getLogger(__name__)

MASTER_FILE = "ha_master"        # <run>/ha_master: the master's HA address, from the registry
RECONNECT = 1.0                  # s between connection attempts
CONNECT_TIMEOUT = 3.0
READ_SIZE = 256 * 1024
RELEASE_EVERY = 64 << 20         # bytes published between drops of the reader's pages from RSS


def master_file(run_path: Path) -> Path:
    return run_path / MASTER_FILE


class StartingOver(Exception):
    """This slave asked for the node restart that empties its store."""


class HAClient:
    def __init__(self, actor: HAActor) -> None:
        self.actor = actor
        cfg = actor.config
        self.store = actor.store
        b = actor.board
        self.written = b.scalar("commitlog.written", writer=actor.name)
        self.store_ts = b.scalar("commitlog.store_ts", writer=actor.name)
        self.connected = b.scalar("ha.connected", writer=actor.name)
        rec = recovery.load(actor.ctx.run_path)
        self.aligned = max(self.written.get(), rec.written)
        self.last_ts = max(self.store_ts.get(), rec.last_store_timestamp)
        self.log_writer = self._open(self.aligned)
        self.reader = CommitLogReader(self.store.commitlog_dir, self.store.commitlog_file_size)
        self.written.set(self.aligned)
        self.store_ts.set(self.last_ts)
        self.heartbeat = cfg.ha_heartbeat_interval
        self.silence = cfg.ha_housekeeping_interval
        self.bells = [FlagBell(b, actor.ctx.run_path, "dispatch", "dispatch.sleeping")]
        if cfg.flush == "sync":
            self.bells.append(FlagBell(b, actor.ctx.run_path, "flush", "flush.sleeping"))
        self._unreleased = 0                    # bytes published since the last release_pages

    def _open(self, position: int) -> CommitLogWriter:
        return CommitLogWriter(self.store.commitlog_dir, self.store.commitlog_file_size, position, {},
                               release_interval=self.store.release_interval_bytes,
                               last_store_timestamp=self.last_ts)

    def master_address(self) -> str | None:
        configured = self.actor.config.ha_master_address
        if configured:
            return configured
        try:
            return master_file(self.actor.ctx.run_path).read_text().strip() or None
        except FileNotFoundError:
            return None

    async def run(self) -> None:
        waiting_logged = False
        repeats = Repeats()                     # a failure at every reconnect: once a minute
        while True:
            addr = self.master_address()
            if addr is None:
                if not waiting_logged:
                    log.info("no master HA address yet (set ha_master_address, or wait for the registry's answer)")
                    waiting_logged = True
            else:
                try:
                    await self._replicate(addr)
                except StartingOver:
                    return
                except (OSError, HAProtocolError, StoreError) as exc:
                    why = f"replication from {addr} stopped at {self.aligned}: {exc}"
                    repeats.log(log, logging.WARNING, f"{why}; reconnecting every {RECONNECT:g}s")
            await asyncio.sleep(RECONNECT)

    async def _replicate(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        reader, writer = await wait_within(asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT)
        try:
            if self.log_writer.wrote_position != self.aligned:      # drop a partial record: it comes again
                self.log_writer.close()
                self.log_writer = self._open(self.aligned)
            log.info("replicating from %s, starting at %d", addr, self.aligned)
            self.connected.set(1)
            writer.write(encode_report(self.aligned))
            reported = time.monotonic()
            decoder = TransferDecoder()
            while True:
                try:
                    data = await wait_within(reader.read(READ_SIZE), self.silence)
                except TimeoutError:
                    raise HAProtocolError(f"the master sent nothing for {self.silence:g}s") from None
                if not data:
                    raise ConnectionError("the master closed the connection")
                moved = False
                for offset, chunk in decoder.feed(data):
                    if chunk:
                        self._append(offset, chunk, addr)
                        moved = True
                if moved:
                    self._publish()
                now = time.monotonic()
                if moved or now - reported >= self.heartbeat:
                    writer.write(encode_report(self.log_writer.wrote_position))
                    reported = now
        finally:
            self.connected.set(0)
            writer.close()

    def _append(self, offset: int, chunk: bytes, master: str) -> None:
        position = self.log_writer.wrote_position
        if offset != position:
            if offset < position or offset % self.store.commitlog_file_size:
                raise HAProtocolError(f"the master sent data for {offset}, this slave's log ends at {position}")
            if position or self.aligned:            # its queues hold entries too: only an empty store goes on
                self._start_over(offset, chunk, master, position)
            log.info("empty slave: the master's CommitLog starts at %d (dispatch follows from there)", offset)
            self.log_writer.close()
            for start in segment_starts(Path(self.store.commitlog_dir)):     # the empty first file
                (Path(self.store.commitlog_dir) / segment_name(start)).unlink()
            self.log_writer = self._open(offset)
            self.aligned = offset
        self.log_writer.append_replica(offset, chunk)

    def _start_over(self, offset: int, chunk: bytes, master: str, position: int) -> None:
        """The master's oldest file starts past this slave's log: ask for the restart that empties
        the store, unless the master's oldest record is older than this slave's newest (two logs)."""
        try:
            magic = SIZE_MAGIC.unpack_from(chunk, 0)[1]
            oldest = store_timestamp_at(chunk, 0) if magic == MESSAGE_MAGIC else None
        except struct.error:
            oldest = None
        if oldest is None:
            raise HAProtocolError(f"the master sent its oldest file at {offset}, past this slave's end at {position}, "
                                  "in a frame that does not begin with a whole record header")
        if oldest < self.last_ts:
            raise HAProtocolError(
                f"the master's CommitLog starts at {offset}, past this slave's end at {position}, but its oldest "
                f"record (stored at {oldest}) is older than this slave's newest ({self.last_ts}): not the log this "
                "slave copied (check ha_master_address); the store is kept, empty it by hand to copy this master")
        reseed.request(self.store.store_path, reseed.Reseed(master, offset, position))
        reason = (f"the master {master} deleted what this slave lacks (its oldest file starts at {offset}, this "
                  f"slave ends at {position}): starting over as its copy")
        log.warning("%s; restarting the node to empty the store", reason)
        self.actor.ctx.control.send({"op": "restart", "reason": reason})
        raise StartingOver(reason)

    def _publish(self) -> None:
        """Move commitlog.written to the end of the last whole record that arrived."""
        try:
            pos, last = self.reader.whole_records(self.aligned, self.log_writer.wrote_position)
        except CorruptRecordError as exc:
            raise HAProtocolError(f"the replicated data is not a CommitLog: {exc}") from None
        if pos == self.aligned:
            return
        self._unreleased += pos - self.aligned
        if self._unreleased >= RELEASE_EVERY:
            self._unreleased = 0
            self.reader.release_pages(pos)
        if last >= 0:
            mf = self.reader.segment(last)
            self.last_ts = store_timestamp_at(mf.view, last - mf.start)
            self.store_ts.set(self.last_ts)
        self.aligned = pos
        self.written.set(pos)
        for bell in self.bells:
            bell.ring()

    def close(self) -> None:
        self.log_writer.close()
        self.reader.close()
