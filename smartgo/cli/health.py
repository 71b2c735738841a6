"""`smartgo health`: is this node healthy? Exit status 0 when it is, 1 when not (a container probe).

    smartgo health [--verbose] [--json]     # the node `python supervisor.py --role master` starts
    smartgo health --store-dir DIR [--run-dir DIR] [--verbose] [--json] [--cpu-interval SECONDS]
    smartgo health --broker HOST:PORT [--verbose] [--json] [--timeout SECONDS]

--store-dir reads the node's board on this machine (default: the store dir a master started
without --store-dir uses, ~/smartgo/master); --broker asks a broker over the wire
(GET_BROKER_RUNTIME_INFO, whose smartgoHealth entry is the same report). An unreachable broker,
or one that does not report its health, is unhealthy (exit 1). The first line names the node
checked; --verbose adds the board's counters, which --json always carries.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from smartgo.actors.board import Board, BoardError
from smartgo.actors.health import node_health
from smartgo.cli.errors import CliError
from smartgo.config import NodeConfig
from smartgo.mqtt.admin import ask_blocking, merge_stats, socket_path
from smartgo.mqtt.listeners import MQTT_PREFIX
from smartgo.net import fastjson
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import RemotingError
from smartgo.net.tls import client_context


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("health", help="show a node's actors and whether the node is healthy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--store-dir", type=Path, metavar="DIR",
                        help="the node's store dir (reads its board; default: a bare master's, ~/smartgo/master)")
    source.add_argument("--broker", metavar="HOST:PORT", help="a broker's address (asks it over the wire)")
    p.add_argument("--run-dir", type=Path, metavar="DIR", help="the node's run dir if not <store-dir>/run")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--verbose", "-v", action="store_true", help="also print the board's counters (always in --json)")
    p.add_argument("--cpu-interval", type=float, default=0.2, metavar="SECONDS",
                   help="--store-dir: CPU %% is measured over this interval (default: 0.2)")
    p.add_argument("--tls", action="store_true", default=os.environ.get("SMARTGO_TLS") == "1",
                   help="with --broker: speak TLS to it (default: $SMARTGO_TLS=1)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="--broker: request timeout (default: 5)")
    p.set_defaults(handler=run)


_BARE_MASTER = "`python supervisor.py --role master`"


def run(args: argparse.Namespace) -> int:
    if args.broker:
        report = broker_report(args.broker, args.timeout, args.tls)
        report["checked"] = {"broker": args.broker}
    else:
        report = board_report(args)
    print(json.dumps(report) if args.json else render(report, args.verbose))
    return 0 if report["healthy"] else 1


def board_report(args: argparse.Namespace) -> dict:
    """The report of the node on --store-dir, or of the one a master started without it runs
    (its default comes from NodeConfig, as the supervisor's does)."""
    default = args.store_dir is None
    store = NodeConfig(role="master").store_path if default else args.store_dir.expanduser()
    path = (args.run_dir.expanduser() if args.run_dir else store / "run") / "board"
    try:
        board = Board.open(path, writable=False)
    except (BoardError, OSError) as e:
        hint = (f"; checked the default store dir of {_BARE_MASTER}: give --store-dir DIR or --broker HOST:PORT "
                "for another node") if default else ""
        raise CliError(f"{e}{hint}") from None
    try:
        report = node_health(board, cpu_interval=args.cpu_interval)
    finally:
        board.close()
    mqtt = local_mqtt(path.parent, report["actors"])
    if mqtt is not None:
        report["mqtt"] = mqtt
    report["checked"] = {"store_dir": str(store), "default": default}
    return report


def local_mqtt(run: Path, actors: list[dict], timeout: float = 2.0) -> dict | None:
    """The MQTT actors' counters, asked over their admin sockets (a broker's report has the same
    from its broker actor, smartgo.broker.processor.mqtt_processor)."""
    names = [a["name"] for a in actors if a["name"].startswith(MQTT_PREFIX)]
    if not names:
        return None
    answering, stats = [], []
    for name in names:
        try:
            stats.append(ask_blocking(socket_path(run, name), {"op": "stats"}, timeout)["stats"])
        except (OSError, ValueError):
            continue
        answering.append(name)
    return {"actors": names, "answering": answering, **merge_stats(stats)}


def mqtt_line(m: dict) -> str:
    qos = "/".join
    return (f"mqtt: {m.get('connections', 0)} connections  {m.get('sessions', 0)} sessions  "
            f"{m.get('subscriptions', 0)} subscriptions  {m.get('retained', 0)} retained  "
            f"messages in {qos(map(str, m.get('messages_in', [0, 0, 0])))}  "
            f"out {qos(map(str, m.get('messages_out', [0, 0, 0])))} (QoS 0/1/2)  dropped {m.get('dropped', 0)}  "
            f"bad packets {m.get('bad_packets', 0)}  auth failures {m.get('auth_failures', 0)}  "
            f"({len(m['answering'])} of {len(m['actors'])} MQTT actors answering)")


def broker_report(addr: str, timeout: float, tls: bool = False) -> dict:
    """The health report a broker puts in its runtime info (CPU %% since its previous report)."""
    client = BlockingRemotingClient(connect_timeout=timeout, ssl_context=client_context() if tls else None)
    try:
        response = client.invoke(addr, RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO), timeout)
    except (RemotingError, OSError) as e:
        raise CliError(f"broker {addr}: {e}") from None
    finally:
        client.close()
    if response.code != ResponseCode.SUCCESS:
        raise CliError(f"broker {addr} answered {response.code}: {response.remark}")
    try:
        return json.loads(fastjson.loads(response.body_bytes())["table"]["smartgoHealth"])
    except (ValueError, KeyError, TypeError):
        raise CliError(f"broker {addr} reports no SmartGo health (not a SmartGo broker?)") from None


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "K", "M", "G"):
        if size < 1024 or unit == "G":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return "-"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _checked(checked: dict | None) -> list[str]:
    if not checked:
        return []
    if "broker" in checked:
        return [f"checked: broker {checked['broker']}"]
    return [f"checked: store dir {checked['store_dir']}" + (f" (the default of {_BARE_MASTER})"
                                                            if checked["default"] else "")]


def render(report: dict, verbose: bool = False) -> str:
    """The table; the board's counters (one long line) only when verbose."""
    node = report["node"]
    lines = _checked(report.get("checked"))
    lines.append(f"node {node['role']}  pid {node['pid']}  {node['state']}  node restarts {node['restarts']}  "
                 f"queues {node['queues']} of {node['queue_limit']}  store {node['store_dir']}")
    rows = [("ACTOR", "PID", "STATE", "HEARTBEAT", "RESTARTS", "CPU%", "RSS", "MAILBOX")]
    for a in report["actors"]:
        rows.append((a["name"], str(a["pid"] or "-"), a["state"],
                     "-" if a["heartbeat_age_s"] is None else f"{a['heartbeat_age_s']:.2f}s",
                     str(a["restarts"]), _num(a["cpu_percent"], ".1f"), _size(a["rss_bytes"]),
                     "-" if a["mailbox_depth"] is None else str(a["mailbox_depth"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if report.get("mqtt"):
        lines.append(mqtt_line(report["mqtt"]))
    if verbose and report["fields"]:
        lines.append("  ".join(f"{k}={v}" for k, v in report["fields"].items()))
    lines.append(report["verdict"])
    return "\n".join(lines)
