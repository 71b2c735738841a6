"""`smartgo mqtt-passwd`: a user entry for the MQTT users file (`--mqtt-users-file`).

    smartgo mqtt-passwd USER [--publish 'devices/%u/#' ...] [--subscribe 'devices/%u/cmd' ...]

Reads the password twice from the terminal (or once from stdin when it is not a terminal) and
prints the YAML entry to add under `users:`: the name, a salted PBKDF2-SHA256 hash (never the
password) and the topic filters the user may publish and subscribe to (`%u` is the user name;
everything when none is given).
"""

from __future__ import annotations

import argparse
import getpass
import sys

import yaml

from smartgo.cli.errors import CliError
from smartgo.mqtt.auth import hash_password
from smartgo.mqtt.topics import valid_filter


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mqtt-passwd", help="make an MQTT users file entry with a hashed password",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("user", help="the user name devices give in CONNECT")
    p.add_argument("--publish", action="append", metavar="FILTER", help="a topic filter it may publish to")
    p.add_argument("--subscribe", action="append", metavar="FILTER", help="a topic filter it may subscribe to")
    p.set_defaults(handler=run)


def _password() -> str:
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\n")
    first = getpass.getpass("password: ")
    if getpass.getpass("again: ") != first:
        raise CliError("the passwords differ")
    return first


def run(args: argparse.Namespace) -> int:
    bad = [f for f in (args.publish or []) + (args.subscribe or []) if not valid_filter(f)]
    if bad:
        raise CliError(f"not a topic filter: {', '.join(bad)}")
    password = _password()
    if not password:
        raise CliError("an empty password")
    entry: dict[str, object] = {"username": args.user, "password_hash": hash_password(password)}
    if args.publish:
        entry["publish"] = args.publish
    if args.subscribe:
        entry["subscribe"] = args.subscribe
    sys.stdout.write(yaml.safe_dump([entry], sort_keys=False))
    return 0
