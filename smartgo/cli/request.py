"""`smartgo request`: send a request message and wait for its reply (request-reply).

    smartgo request --topic T --body "ping" [--tags TagA] [--property k=v ...] [--timeout 5] [--json]

A consumer of T answers it (smartgo.client.create_reply_message, sent with any producer). Prints
the reply's body (and, with --json, the whole reply message); no reply within --timeout is an
error (exit status 1).
"""

from __future__ import annotations

import argparse
import sys

from smartgo.cli._common import add_common, client_options, emit, guarded, parse_properties
from smartgo.client import AsyncProducer, Message
from smartgo.client.message import message_to_json
from smartgo.net.loop import run as run_loop


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("request", help="send a request and wait for its reply", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--body", "-b", required=True, help="request body (UTF-8 text)")
    p.add_argument("--tags", help="the request's tag")
    p.add_argument("--property", "-p", action="append", metavar="KEY=VALUE", help="a user property (repeatable)")
    p.add_argument("--group", "-g", default="smartgo-cli-requester", help="producer group (default: %(default)s)")
    p.set_defaults(handler=guarded(run))


def run(args: argparse.Namespace) -> int:
    msg = Message(args.topic, args.body.encode("utf-8"), tags=args.tags, properties=parse_properties(args.property))

    async def main() -> int:
        async with AsyncProducer(args.group, args.registry, send_timeout=args.timeout,
                                 **client_options(args)) as producer:
            reply = await producer.request(msg, args.timeout)
        if args.json:
            emit(message_to_json(reply))
        else:
            sys.stdout.buffer.write(reply.body + b"\n")
            sys.stdout.flush()
        return 0
    return run_loop(main())
