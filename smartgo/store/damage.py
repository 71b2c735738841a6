"""Damaged records in flushed CommitLog data: recovery replaces them and goes on.

A record below the checkpoint's flushed offset that fails its checks is damage (bit rot, a
lost page write), not a torn tail: cutting the CommitLog there, as RocketMQ does, would drop
every acknowledged message after it, and a damaged record found while re-dispatching older
files kept the store from opening at all. Recovery instead finds the next record that passes
every check (magic, lengths, body CRC, PHYSICALOFFSET equal to its position), copies the bytes
in between to <store>/damaged/ and overwrites them with a filler that every CommitLog reader
steps over: a blank filler when the next good data is the next file, else one record of a
rolled-back transaction (topic SMARTGO_DAMAGED, queue offset -1) that neither our dispatch nor
RocketMQ's puts in a ConsumeQueue or the index. ConsumeQueue entries pointing into the range
become holes, so every queue keeps the offsets its consumers have seen.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from smartgo.store.checkpoint import Checkpoint
from smartgo.store.commitlog import CommitLogReader
from smartgo.store.config import StoreConfig
from smartgo.store.consume_queue import ConsumeQueueSet
from smartgo.store.errors import OffsetGoneError
from smartgo.store.mapped_file import segment_name
from smartgo.store.record import (BLANK_MAGIC, FIXED_SIZE, INT32, MESSAGE_MAGIC, SIZE_MAGIC,
                                  TRANSACTION_ROLLBACK_TYPE, check_record, encode_record, store_timestamp_at)

log = logging.getLogger(__name__)

FILLER_TOPIC = "SMARTGO_DAMAGED"
DAMAGED_DIR = "damaged"
FOUND = "found.jsonl"        # in DAMAGED_DIR: what a running node's scrub found, for the next start
SCRUB_STEP = 1 << 20         # bytes a background scrub step checks between two pauses
_MIN_RECORD = FIXED_SIZE + 1  # the smallest record: a one-character topic, no body, no properties
_MAGIC = INT32.pack(MESSAGE_MAGIC)
_BLANK = INT32.pack(BLANK_MAGIC)


@dataclass(frozen=True, slots=True)
class Damage:
    begin: int   # the first byte that failed the checks (a record start)
    end: int     # the next good record, blank filler or file
    saved: Path  # the damaged bytes, as they were


def next_good(cl: CommitLogReader, pos: int, flushed: int) -> int | None:
    """Where good data resumes after the damaged record at pos: the first record in its file
    that passes every check (at least a minimal record further), or the file's blank filler;
    else the flushed offset if it is in this file (a flush always ends at a record boundary),
    else the next file. None when there is no next file."""
    fs = cl.file_size
    mf = cl.segment(pos)
    base, mm, view = mf.start, mf.mm, mf.view
    rel = pos - base
    good = mf.size
    at = mm.find(_MAGIC, rel + _MIN_RECORD + 4)
    while at >= 0:
        if check_record(view, at - 4, mf.size, base + at - 4):
            good = at - 4
            break
        at = mm.find(_MAGIC, at + 1)
    blank = mm.find(_BLANK, rel + 12, good + 4)   # a blank filler before it (its size must reach the file end)
    while blank >= 0:
        if SIZE_MAGIC.unpack_from(mm, blank - 4)[0] == fs - blank + 4:
            return base + blank - 4
        blank = mm.find(_BLANK, blank + 1, good + 4)
    if good < mf.size:
        return base + good
    if flushed < base + fs:
        return flushed
    return base + fs if base + fs in cl.files.starts() else None


def replace(store: Path, cl: CommitLogReader, begin: int, end: int) -> Damage:
    """Save [begin, end) to <store>/damaged/ and overwrite it with a filler (durably: the
    copy and the filler are synced before recovery goes on)."""
    fs = cl.file_size
    mf = cl.segment(begin)
    rel = begin - mf.start
    length = end - begin
    folder = store / DAMAGED_DIR
    folder.mkdir(parents=True, exist_ok=True)
    saved = folder / f"commitlog-{begin:020d}-{length}.bin"
    with open(saved, "wb") as f:
        f.write(mf.mm[rel:rel + min(length, mf.size - rel)])
        f.flush()
        os.fsync(f.fileno())
    if end - end % fs != mf.start or length < _MIN_RECORD:
        filler = SIZE_MAGIC.pack(fs - rel, BLANK_MAGIC)   # the good data is in the next file
    else:
        filler = _filler_record(begin, length, _timestamp_at(cl, end))
    fd = os.open(cl.files.path_of(mf.start), os.O_WRONLY)
    try:
        os.pwrite(fd, filler, rel)
        os.fsync(fd)
    finally:
        os.close(fd)
    return Damage(begin, end, saved)


def _filler_record(phys: int, length: int, store_ts: int) -> bytes:
    topic = FILLER_TOPIC[:length - FIXED_SIZE]
    body = bytes(length - FIXED_SIZE - len(topic))
    return encode_record(topic, 0, body, sys_flag=TRANSACTION_ROLLBACK_TYPE, queue_offset=-1, physical_offset=phys,
                         born_timestamp=store_ts, store_timestamp=store_ts, max_body=len(body))


def _timestamp_at(cl: CommitLogReader, pos: int) -> int:
    """Store time of the record at pos (the filler's), 0 for a blank filler or a new file."""
    mf = cl.segment(pos)
    rel = pos - mf.start
    if rel + FIXED_SIZE <= mf.size and SIZE_MAGIC.unpack_from(mf.mm, rel)[1] == MESSAGE_MAGIC:
        return store_timestamp_at(mf.mm, rel)
    return 0


def hole_out(queues: ConsumeQueueSet, damage: Damage) -> None:
    """Turn every ConsumeQueue entry pointing into the damaged range into a hole."""
    holed = {cq.key: offsets for cq in queues.queues.values() if (offsets := cq.hole_out(damage.begin, damage.end))}
    if holed:
        log.warning("ConsumeQueue entries pointed into the damaged CommitLog bytes [%d, %d): now holes (%s)",
                    damage.begin, damage.end, ", ".join(f"{t}/{q} offsets {o}" for (t, q), o in holed.items()))


def replace_misplaced(store: Path, cl: CommitLogReader, phys: int, size: int) -> Damage:
    """A flushed record whose queue id or offset disagree with the ConsumeQueue entry pointing
    at it (fields no check covers): replaced like any damage; the entry is a hole already."""
    damage = replace(store, cl, phys, phys + size)
    log.error("CommitLog record [%d, %d) disagrees with its ConsumeQueue entry on its queue id or offset: the "
              "message there is lost; its bytes are saved to %s and replaced by a filler", phys, phys + size,
              damage.saved)
    return damage


def repair(store: Path, cl: CommitLogReader, pos: int, flushed: int) -> Damage | None:
    """Replace the damaged record at pos if it is flushed data followed by a good record; None
    (nothing changed) for anything else: recovery cuts a torn tail as before."""
    if pos >= flushed:
        return None
    try:
        end = next_good(cl, pos, flushed)
    except OffsetGoneError:
        return None
    if end is None:
        log.error("CommitLog offset %d (below the flushed offset %d) fails the record checks and its file is "
                  "the last one: the data is cut there", pos, flushed)
        return None
    damage = replace(store, cl, pos, end)
    log.error("CommitLog bytes [%d, %d) in file %s fail the record checks below the flushed offset %d: the "
              "message there is lost; its bytes are saved to %s and replaced by a filler, and the messages after "
              "it are kept", pos, end, segment_name(pos - pos % cl.file_size), flushed, damage.saved)
    return damage


def note_found(store: Path, begin: int, end: int) -> None:
    """A running node's scrub found damage at [begin, end): listed for the next start to repair
    (the running node must not rewrite what its actors map and index)."""
    folder = store / DAMAGED_DIR
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / FOUND, "a") as f:
        f.write(json.dumps({"begin": begin, "end": end}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def repair_found(store: Path, cl: CommitLogReader, below: int, flushed: int) -> list[Damage]:
    """At start-up, before the walk: repair the ranges a running node's scrub listed in files the
    walk does not read (before `below`); the list is then consumed. A range already repaired (by
    `smartgo scrub --repair`) or deleted with its file is skipped."""
    path = store / DAMAGED_DIR / FOUND
    if not path.exists():
        return []
    damages = []
    for line in path.read_text().splitlines():
        try:
            begin = int(json.loads(line)["begin"])
        except (ValueError, KeyError, TypeError):
            log.warning("%s: a line that names no range, skipped: %r", path, line[:100])
            continue
        if begin >= min(below, flushed):
            continue                                   # the walk meets it, or it is no longer flushed data
        try:
            mf = cl.segment(begin)
        except OffsetGoneError:
            continue
        if check_record(mf.view, begin - mf.start, mf.size, begin):
            continue
        damage = repair(store, cl, begin, flushed)
        if damage is not None:
            damages.append(damage)
    path.unlink()
    return damages


class ScrubCursor:
    """A running node's background scrub: it checks the flushed records (magic, lengths, body CRC,
    PHYSICALOFFSET) a budget at a time, so its owner can pace it. Damage is logged and listed
    for the next start to repair (note_found); the walk resumes at the next good record."""

    def __init__(self, store: Path, cl: CommitLogReader) -> None:
        self.store = store
        self.cl = cl
        self.position = 0
        self.records = 0
        self.damaged: list[tuple[int, int]] = []

    def start_pass(self, minimum: int) -> None:
        self.position, self.records, self.damaged = minimum, 0, []

    def step(self, minimum: int, bound: int, budget: int) -> int:
        """Check about `budget` bytes from the cursor below bound, which must be a record boundary
        (the node's flushed and dispatched positions); the bytes covered, 0 once at the bound."""
        cl = self.cl
        cl.forget_before(minimum)                     # cleanup deleted them: unmap
        pos = max(self.position, minimum)
        if pos >= bound:
            return 0
        walk = cl.walk(pos, bound, verify=True)
        for phys, _, _, size in walk:
            self.records += 1
            if phys + size - pos >= budget:
                end = phys + size
                break
        else:
            end = walk.position
            if walk.stopped == "no file":
                end = min([s for s in cl.files.starts() if s > pos] + [bound])
            elif walk.stopped is not None and end < bound:
                resume = next_good(cl, end, bound)
                resume = bound if resume is None else resume
                log.error("CommitLog bytes [%d, %d) fail the record checks (background scrub): the message there is "
                          "lost, the rest is served; listed in %s/%s, repaired at the next start", end, resume,
                          DAMAGED_DIR, FOUND)
                note_found(self.store, end, resume)
                self.damaged.append((end, resume))
                end = resume
        cl.files.release_all()                        # the pages stay cached; not in this process's RSS
        self.position = end
        return max(end - pos, 1)


@dataclass(slots=True)
class ScrubReport:
    records: int = 0                  # good records checked
    checked_to: int = 0               # where the check stopped: the flushed offset, or why not
    stopped: str | None = None        # why the walk stopped short of the flushed offset (None: it did not)
    damaged: list[tuple[int, int]] = field(default_factory=list)   # [begin, end) ranges that failed
    repaired: list[Damage] = field(default_factory=list)


def scrub(config: StoreConfig, repair: bool = False) -> ScrubReport:
    """Check every CommitLog record below the checkpoint's flushed offset, in every file, not
    only those recovery reads at start-up; with repair, replace each damaged range as recovery
    does (its ConsumeQueue entries become holes). Only with the node stopped (the caller holds
    the store's locks): a running node keeps writing and mapping these files."""
    checkpoint = Checkpoint(config.checkpoint_path)
    try:
        flushed = checkpoint.physic_offset
    finally:
        checkpoint.close()
    cl = CommitLogReader(config.commitlog_dir, config.commitlog_file_size)
    queues = ConsumeQueueSet(config.consume_queue_dir, config.consume_queue_file_size) if repair else None
    report = ScrubReport()
    try:
        starts = cl.files.starts()
        pos = starts[0] if starts else 0
        while pos < flushed:
            walk = cl.walk(pos, flushed, verify=True)
            for _ in walk:
                report.records += 1
            pos = walk.position
            if pos >= flushed or walk.stopped == "no file":
                report.stopped = walk.stopped if pos < flushed else None
                break
            end = next_good(cl, pos, flushed)
            if end is None:
                report.stopped = f"damage at {pos} and no later file"
                break
            report.damaged.append((pos, end))
            if queues is not None:
                damage = replace(config.root, cl, pos, end)
                hole_out(queues, damage)
                report.repaired.append(damage)
            pos = end
        report.checked_to = pos
    finally:
        if queues is not None:
            queues.close()
        cl.close()
    return report
