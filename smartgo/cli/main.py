"""The `smartgo` command. Each subcommand is a module of this package with a `register(subparsers)`
function; main() discovers them, so a new command (send, consume, admin, bench...) is a new
module and nothing here changes.

A subcommand's handler returns the exit status; CliError (or any error) becomes one line on
stderr and a non-zero status, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import smartgo.cli
from smartgo.cli.errors import CliError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smartgo", description="SmartGo command-line tools.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(smartgo.cli.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in ("main", "errors"):
            continue
        module = importlib.import_module(f"smartgo.cli.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except CliError as e:
        print(f"smartgo {args.command}: {e}", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the promise: one clear line, never a traceback
        print(f"smartgo {args.command}: unexpected error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
