"""What the client subcommands (send, consume, admin, bench) share: the registry option, --json,
output helpers, and turning client errors into one clear line (CliError)."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from smartgo.cli.errors import CliError
from smartgo.client.errors import ClientError
from smartgo.net.errors import RemotingError

DEFAULT_REGISTRY = "127.0.0.1:9876"


def default_registry() -> str:
    return os.environ.get("SMARTGO_REGISTRY") or os.environ.get("NAMESRV_ADDR") or DEFAULT_REGISTRY


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--registry", "-n", default=default_registry(), metavar="HOST:PORT[;HOST:PORT]",
                   help="registry (name server) addresses (default: $SMARTGO_REGISTRY, $NAMESRV_ADDR or %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output (one JSON document, or JSON lines "
                                                       "for streams)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="request timeout (default: 5)")
    p.add_argument("--log-level", default="ERROR", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="client log lines shown on stderr (default: %(default)s)")
    p.add_argument("--access-key", default=os.environ.get("SMARTGO_ACCESS_KEY", ""), metavar="KEY",
                   help="ACL access key: sign every request (default: $SMARTGO_ACCESS_KEY)")
    p.add_argument("--secret-key", default=os.environ.get("SMARTGO_SECRET_KEY", ""), metavar="SECRET",
                   help="ACL secret key (default: $SMARTGO_SECRET_KEY; prefer it to the flag, which ps shows)")
    p.add_argument("--tls", action="store_true", default=os.environ.get("SMARTGO_TLS") == "1",
                   help="speak TLS to the registries and brokers (useTLS; default: $SMARTGO_TLS=1)")
    p.add_argument("--tls-ca-file", default=os.environ.get("SMARTGO_TLS_CA_FILE", ""), metavar="PEM",
                   help="accept only servers whose certificate this CA signed (default: any, as Java's clients)")
    p.add_argument("--tls-cert-file", default=os.environ.get("SMARTGO_TLS_CERT_FILE", ""), metavar="PEM",
                   help="this client's certificate, for brokers that ask for one (and --tls-key-file)")
    p.add_argument("--tls-key-file", default=os.environ.get("SMARTGO_TLS_KEY_FILE", ""), metavar="PEM")


def guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Client and network failures become CliError: one line, exit status 1."""
    def run(args: argparse.Namespace) -> int:
        logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            return handler(args)
        except CliError:
            raise
        except (ClientError, RemotingError, OSError, ValueError) as exc:
            raise CliError(str(exc) or type(exc).__name__) from None
        except TimeoutError as exc:
            raise CliError(f"timed out: {exc}") from None
    return run


def emit(doc: Any) -> None:
    """One JSON document (or one JSON line of a stream) on stdout."""
    sys.stdout.write(json.dumps(doc, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def when(ms: int) -> str:
    """A store or born time (ms since the epoch) in local time, "-" for none."""
    return datetime.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds") if ms > 0 else "-"


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def parse_properties(items: Iterable[str] | None) -> dict[str, str]:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--property {item!r} is not KEY=VALUE")
        out[key] = value
    return out


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    credentials = {"access_key": args.access_key, "secret_key": args.secret_key} if args.access_key else {}
    tls = {"use_tls": True, "tls_ca_file": args.tls_ca_file, "tls_cert_file": args.tls_cert_file,
           "tls_key_file": args.tls_key_file} if args.tls else {}
    return {"timeout": args.timeout, **credentials, **tls}


def add_trace(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", action="store_true",
                   help="message trace on (enableMsgTrace): `smartgo admin trace --id MSGID` shows what happened")
    p.add_argument("--trace-topic", metavar="TOPIC", help="where traces go (default: RMQ_SYS_TRACE_TOPIC)")


def trace_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"enable_msg_trace": args.trace, "trace_topic": args.trace_topic}


Configure = Callable[[argparse.ArgumentParser], None]

# option specs several `smartgo admin` commands share
GROUP = (("--group", "-g"), {"required": True})
TOPIC = (("--topic", "-t"), {"required": True})
BROKER = (("--broker", "-b"), {"required": True, "metavar": "HOST:PORT"})


def options(*specs: tuple) -> Configure:
    """A subcommand's options from (flags, keyword arguments) pairs."""
    def configure(c: argparse.ArgumentParser) -> None:
        for flags, kwargs in specs:
            c.add_argument(*flags, **kwargs)
    return configure


def broker_or_cluster(c: argparse.ArgumentParser, cluster_help: str = "every master of this cluster (default: all "
                      "masters)", required: bool = False) -> None:
    """--broker HOST:PORT or --cluster C, one of them (the brokers an admin command goes to)."""
    where = c.add_mutually_exclusive_group(required=required)
    where.add_argument("--cluster", "-c", help=cluster_help)
    where.add_argument("--broker", "-b", metavar="HOST:PORT", help="only this broker")


class CommandTable(dict):
    """`smartgo admin` commands kept in a module of their own: name -> (help, configure, handler),
    the handler an `async (admin, args)`."""

    def command(self, name: str, help_text: str, configure: Configure):
        def deco(fn):
            self[name] = (help_text, configure, fn)
            return fn
        return deco

