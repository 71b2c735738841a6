"""`smartgo scrub`: check every flushed CommitLog record of a stopped node's store.

    smartgo scrub --store-dir DIR [--run-dir DIR] [--repair] [--json]

Recovery reads only the newest files at start-up, so damage in older ones (bit rot, a lost page
write) shows up only when a consumer reads it. This reads every record below the checkpoint's
flushed offset (magic, lengths, body CRC, PHYSICALOFFSET) and lists the ranges that fail. With
--repair each range is replaced as recovery does: its bytes saved under <store>/damaged/, a filler
record written, the ConsumeQueue entries pointing there turned into holes. The node must be
stopped (its locks are taken). Exit status: 0 when nothing is damaged (or everything found was
repaired), 1 when damage is left, 2 when the store cannot be checked (a node holds it).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from smartgo.cli.errors import CliError
from smartgo.store import StoreConfig, StoreLock, StoreLockedError
from smartgo.store.damage import scrub


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scrub", help="check every flushed record of a stopped node's store (and repair it)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store-dir", type=Path, required=True, metavar="DIR", help="the node's store dir")
    p.add_argument("--run-dir", type=Path, metavar="DIR", help="the node's run dir if not <store-dir>/run")
    p.add_argument("--repair", action="store_true", help="replace each damaged range (as recovery does)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    store = args.store_dir.expanduser()
    if not (store / "commitlog").is_dir():
        raise CliError(f"{store} holds no CommitLog", status=2)
    with _stopped_node(store, args.run_dir or store / "run"):
        report = scrub(_config(store), repair=args.repair)
    left = len(report.damaged) - len(report.repaired)
    out = {"records": report.records, "checked_to": report.checked_to, "stopped": report.stopped,
           "damaged": [list(r) for r in report.damaged], "repaired": len(report.repaired),
           "saved": [str(d.saved) for d in report.repaired]}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{report.records} records checked up to offset {report.checked_to}"
              + (f" (stopped: {report.stopped})" if report.stopped else ""))
        for begin, end in report.damaged:
            print(f"damaged: [{begin}, {end}) {end - begin} bytes")
        for d in report.repaired:
            print(f"repaired: [{d.begin}, {d.end}), the bytes saved to {d.saved}")
        if left:
            print(f"{left} damaged ranges left: run again with --repair (with the node stopped)")
    return 1 if left else 0


def _config(store: Path) -> StoreConfig:
    """File sizes from the files themselves (segments are created at their full size, sparse or
    not), so no node config is needed."""
    return StoreConfig(store_path=str(store), commitlog_file_size=_file_size(store / "commitlog", 1 << 30),
                       consume_queue_file_size=_file_size(store / "consumequeue", 300_000 * 20))


def _file_size(directory: Path, default: int) -> int:
    sizes = [p.stat().st_size for p in directory.rglob("*") if p.name.isdigit() and p.is_file()]
    return max(sizes, default=default)


@contextmanager
def _stopped_node(store: Path, run_dir: Path) -> Iterator[None]:
    """Hold the node's locks (the supervisor's and the store's) for the scrub, or refuse."""
    with ExitStack() as held:
        if (run_dir / "supervisor.lock").exists():
            try:
                held.enter_context(StoreLock(run_dir, "supervisor.lock"))
            except StoreLockedError as e:
                raise CliError(f"a node (supervisor pid {e.holder_pid or '?'}) is running on {store}: stop it first",
                               status=2) from None
        try:
            held.enter_context(StoreLock(store))
        except StoreLockedError as e:
            raise CliError(f"{e}: stop the node first", status=2) from None
        yield
