"""`smartgo admin` commands for the MQTT devices of the brokers (MQTT_ADMIN, SmartGo's own request;
each broker asks its MQTT actors):

    smartgo admin mqtt-clients [--client PREFIX] [--limit 100] [--broker ADDR | --cluster C]
    smartgo admin mqtt-sessions [--client PREFIX] [--limit 100] [--broker ADDR | --cluster C]
    smartgo admin mqtt-subscriptions [--client PREFIX] [--filter PREFIX] [--limit 100] [...]
    smartgo admin mqtt-kick --client ID [--broker ADDR | --cluster C]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from smartgo.cli._common import CommandTable, broker_or_cluster, emit, table
from smartgo.cli.errors import CliError
from smartgo.client import AsyncAdmin
from smartgo.mqtt.admin import DEFAULT_LIMIT, MAX_LIMIT

COMMANDS = CommandTable()
command = COMMANDS.command

Row = Callable[[dict], tuple]
COLUMNS: dict[str, tuple[tuple[str, ...], Row]] = {
    "clients": (("CLIENT", "PEER", "LISTENER", "VERSION", "KEEPALIVE", "SUBS", "INFLIGHT", "QUEUED"),
                lambda i: (i["client_id"], i["peer"], i["listener"], {3: "3.1", 4: "3.1.1", 5: "5.0"}.get(
                    i["version"], i["version"]), i["keep_alive"], i["subscriptions"], i["inflight"], i["queued"])),
    "sessions": (("CLIENT", "CONNECTED", "EXPIRY", "EXPIRES_IN", "SUBS", "QUEUED", "QUEUED_BYTES", "INFLIGHT",
                  "DROPPED"),
                 lambda i: (i["client_id"], "yes" if i["connected"] else "no", i["expiry"],
                            "-" if i["expires_in"] is None else i["expires_in"], i["subscriptions"], i["queued"],
                            i["queued_bytes"], i["inflight"], i["dropped"])),
    "subscriptions": (("CLIENT", "FILTER", "QOS", "NO_LOCAL", "RETAIN_AS_PUBLISHED", "RETAIN_HANDLING", "ID"),
                      lambda i: (i["client_id"], i["filter"], i["qos"], int(i["no_local"]),
                                 int(i["retain_as_published"]), i["retain_handling"], i["identifier"] or "-"))}


def _limit(text: str) -> int:
    n = int(text)
    if not 0 <= n <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"--limit must be 0..{MAX_LIMIT}")
    return n


def _list_options(filters: bool) -> Callable[[argparse.ArgumentParser], None]:
    def configure(c: argparse.ArgumentParser) -> None:
        c.add_argument("--client", default="", metavar="PREFIX", help="only client ids starting with this")
        if filters:
            c.add_argument("--filter", default="", metavar="PREFIX", help="only topic filters starting with this")
        c.add_argument("--limit", type=_limit, default=DEFAULT_LIMIT,
                       help=f"rows per broker, by client id (default: %(default)s, at most {MAX_LIMIT})")
        broker_or_cluster(c, "every broker of this cluster, slaves too (default: all brokers)")
    return configure


def _warn_silent(answers: dict[str, dict]) -> None:
    for addr, answer in answers.items():
        for actor, why in answer.get("errors", {}).items():
            print(f"warning: {addr} {actor} did not answer: {why}", file=sys.stderr)


async def _list(admin: AsyncAdmin, args: argparse.Namespace, op: str) -> None:
    request = {"op": op, "client": args.client, "limit": args.limit, "filter": getattr(args, "filter", "")}
    answers = await admin.mqtt(request, cluster=args.cluster, broker_addr=args.broker)
    _warn_silent(answers)
    if args.json:
        emit({"brokers": answers})
        return
    header, row = COLUMNS[op]
    rows = [(addr, *row(item)) for addr, answer in sorted(answers.items()) for item in answer["items"]]
    print(table(rows, ("BROKER", *header)))
    for addr, answer in sorted(answers.items()):
        if not answer["actors"]:
            print(f"{addr}: no MQTT actors (its mqtt_port, mqtt_ws_port and mqtt_tls_port are off)")
        elif answer["total"] > len(answer["items"]):
            print(f"{addr}: {len(answer['items'])} of {answer['total']} shown (--limit)")


@command("mqtt-clients", "MQTT clients connected to the brokers: peer, listener, MQTT version, keep alive, "
         "subscriptions, messages in flight and queued", _list_options(False))
async def _mqtt_clients(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    await _list(admin, args, "clients")


@command("mqtt-sessions", "MQTT sessions, connected or waiting for their client (persistent): expiry, queued "
         "and dropped messages", _list_options(False))
async def _mqtt_sessions(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    await _list(admin, args, "sessions")


@command("mqtt-subscriptions", "MQTT subscriptions: client, topic filter, QoS and MQTT 5.0 options",
         _list_options(True))
async def _mqtt_subscriptions(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    await _list(admin, args, "subscriptions")


def _kick_options(c: argparse.ArgumentParser) -> None:
    c.add_argument("--client", required=True, metavar="ID", help="the client id")
    broker_or_cluster(c, "every broker of this cluster, slaves too (default: all brokers)")


@command("mqtt-kick", "disconnect an MQTT client (MQTT 5.0 DISCONNECT reason 0x98, administrative action); "
         "its session stays as its expiry says", _kick_options)
async def _mqtt_kick(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    answers = await admin.mqtt({"op": "kick", "client": args.client}, cluster=args.cluster, broker_addr=args.broker)
    _warn_silent(answers)
    kicked = sorted(addr for addr, answer in answers.items() if answer["kicked"])
    if args.json:
        emit({"client": args.client, "kicked": kicked})
    if not kicked:
        raise CliError(f"no MQTT client {args.client!r} is connected to {', '.join(sorted(answers))}")
    if not args.json:
        print(f"disconnected {args.client} at {', '.join(kicked)}")
