"""`smartgo send`: send messages to a topic.

    smartgo send --topic T --body "hello" [--tags TagA] [--keys "k1 k2"] [--property k=v ...]
    echo -e "a\\nb" | smartgo send --topic T          # one message per input line
    smartgo send --topic T --body x --count 100 --mode async [--sharding-key order-7] [--json]
    smartgo send --topic T --body x --transaction commit --group PG_TX   # rollback, unknown

Prints the SendResult of each message (status, msg id, offset msg id, queue, queue offset).
--transaction sends each message as a transaction's half message and ends the transaction as
told (a message committed is delivered, one rolled back is not); `unknown` leaves it open, for
the broker to check back with a producer of --group (answered the same way while this runs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from smartgo.cli._common import add_common, add_trace, client_options, emit, guarded, parse_properties, trace_options
from smartgo.cli.errors import CliError
from smartgo.client import AsyncProducer, LocalTransactionState, Message, MessageExt, SendResult
from smartgo.client.transaction import TransactionSendResult
from smartgo.net.loop import run as run_loop


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("send", help="send messages", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--topic", "-t", required=True)
    body = p.add_mutually_exclusive_group()
    body.add_argument("--body", "-b", help="message body (UTF-8 text); without --body/--file, stdin lines")
    body.add_argument("--file", type=Path, help="send this file's bytes as one message body")
    p.add_argument("--tags", help="the message's tag")
    p.add_argument("--keys", help="business keys, space separated (indexed: query-key finds them)")
    p.add_argument("--property", "-p", action="append", metavar="KEY=VALUE", help="a user property (repeatable)")
    delay = p.add_mutually_exclusive_group()
    delay.add_argument("--delay-level", type=int, default=0, metavar="1-18", help="deliver after this delay level")
    delay.add_argument("--delay-ms", type=int, default=0, metavar="MS",
                       help="a timer message: deliver this many ms after the broker stores it (any delay up to "
                            "the broker's timer_max_delay_sec)")
    p.add_argument("--count", "-c", type=int, default=1, help="send --body/--file this many times (default: 1)")
    p.add_argument("--mode", choices=("sync", "async", "oneway"), default="sync")
    p.add_argument("--sharding-key", help="ordered send: messages with one key go to one queue, in order")
    p.add_argument("--group", "-g", default="smartgo-cli-producer", help="producer group (default: %(default)s)")
    p.add_argument("--transaction", choices=[s.lower() for s in _ENDINGS],
                   help="send in a transaction and end it so (sync sends, one at a time)")
    add_trace(p)
    p.set_defaults(handler=guarded(run))


_ENDINGS = {"COMMIT": LocalTransactionState.COMMIT_MESSAGE, "ROLLBACK": LocalTransactionState.ROLLBACK_MESSAGE,
            "UNKNOWN": LocalTransactionState.UNKNOW}


class _Decided:
    """A transaction listener that gives every transaction, and every check-back, one answer."""

    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state

    async def execute(self, msg: Message, arg: object) -> LocalTransactionState:
        return self.state

    async def check(self, msg: MessageExt) -> LocalTransactionState:
        return self.state


def _bodies(args: argparse.Namespace) -> Iterator[bytes]:
    if args.file is not None:
        data = args.file.read_bytes()
        yield from (data for _ in range(args.count))
    elif args.body is not None:
        data = args.body.encode("utf-8")
        yield from (data for _ in range(args.count))
    else:
        if sys.stdin.isatty():
            raise CliError("give --body or --file, or pipe messages (one per line) into stdin")
        for line in sys.stdin.buffer:
            line = line.rstrip(b"\r\n")
            if line:
                yield line


def _show(args: argparse.Namespace, n: int, result: SendResult | None, error: BaseException | None,
          body_size: int) -> None:
    ended = result.local_state.name if isinstance(result, TransactionSendResult) else None
    if args.json:
        emit({"index": n, **(result.to_json() if result else {}), **({"error": str(error)} if error else {}),
              **({"transaction": ended} if ended else {})})
    elif error is not None:
        print(f"#{n} FAILED: {error}")
    elif result is None:
        print(f"#{n} sent oneway ({body_size} bytes)")
    else:
        print(f"#{n} {result.status.name} msgId={result.msg_id} offsetMsgId={result.offset_msg_id} "
              f"queue={result.queue.broker_name}:{result.queue.queue_id} queueOffset={result.queue_offset}"
              + (f" transaction={ended}" if ended else ""))


def run(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise CliError("--count must be at least 1")
    if args.transaction and (args.mode != "sync" or args.sharding_key is not None or args.delay_level):
        raise CliError("--transaction sends one message at a time, sync, to any queue, without delay: "
                       "it takes no --mode, --sharding-key or --delay-level")
    props = parse_properties(args.property)
    listener = _Decided(_ENDINGS[args.transaction.upper()]) if args.transaction else None

    single = args.count == 1 and (args.body is not None or args.file is not None)

    async def main() -> int:
        failures = 0
        async with AsyncProducer(args.group, args.registry, send_timeout=args.timeout, transaction_listener=listener,
                                 **client_options(args), **trace_options(args)) as producer:
            pending = []
            for n, body in enumerate(_bodies(args), 1):
                msg = Message(args.topic, body, tags=args.tags, keys=args.keys, properties=dict(props),
                              delay_level=args.delay_level, delay_time_ms=args.delay_ms)
                if args.mode == "oneway":
                    await producer.send_oneway(msg)
                    _show(args, n, None, None, len(body))
                    continue
                if args.mode == "async" and args.sharding_key is None:
                    pending.append((n, producer.send_async(msg)))
                    continue
                try:
                    if listener is not None:
                        result: SendResult = await producer.send_in_transaction(msg)
                    elif args.sharding_key is not None:
                        result = await producer.send_orderly(msg, args.sharding_key)
                    else:
                        result = await producer.send(msg)
                except Exception as exc:
                    if single:
                        raise
                    failures += 1
                    _show(args, n, None, exc, len(body))
                    continue
                _show(args, n, result, None, len(body))
            for n, fut in pending:
                try:
                    _show(args, n, await fut, None, 0)
                except Exception as exc:
                    failures += 1
                    _show(args, n, None, exc, 0)
        return 1 if failures else 0
    return run_loop(main())
