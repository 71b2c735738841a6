"""`smartgo consume`: print a topic's messages as they arrive.

    smartgo consume --topic T [--expression "TagA || TagB" | --sql "a > 5"] [--group G] [--from first|last|<ms>]
                    [--broadcast] [--orderly] [--count N] [--idle-timeout S] [--json]
    smartgo consume --topic T --pull [--from first|last|<ms>]   # no group, no commits: read the queues
    smartgo consume --topic T --lite [--group G] [--broadcast]  # a polled lite pull consumer

A push consumer by default (clustering; offsets committed for the group). --pull reads every
queue directly with a pull consumer from --from on, commits nothing, and needs no consumer group
on the broker. --lite polls a lite pull consumer (Java's DefaultLitePullConsumer) of the group
and commits each batch once it is printed. --sql takes the messages whose properties a SQL92 expression selects (the
broker evaluates it, as for MessageSelector.bySql). Stops after --count messages, after
--idle-timeout seconds without one, or on ^C. After a quiet spell of 2 s it says once on stderr
what it has and what it waits for, so a terminal that has gone quiet is not a mystery.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from smartgo.cli._common import add_common, add_trace, client_options, emit, guarded, trace_options
from smartgo.cli.errors import CliError
from smartgo.client import (AsyncLitePullConsumer, AsyncPullConsumer, AsyncPushConsumer, ConsumeResult, MessageModel,
                            MessageQueue, MessageSelector, PullStatus)
from smartgo.client.message import message_to_json
from smartgo.net.loop import run as run_loop, wait_within
from smartgo.store.record import MessageExt

QUIET_SPELL = 2.0   # seconds without a message before the one waiting line on stderr


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("consume", help="print a topic's messages", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--topic", "-t", required=True)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--expression", "-e", default="*", help='tags to take: "TagA || TagB" or "*" (default)')
    which.add_argument("--sql", metavar="EXPR",
                       help="SQL92 on message properties, e.g. \"a BETWEEN 1 AND 3 AND TAGS IN ('TagA')\"")
    p.add_argument("--group", "-g", help="consumer group (default: smartgo-cli-<pid>, a new group)")
    p.add_argument("--from", dest="start", default="last", metavar="first|last|MS",
                   help="where a new group starts: first, last (default) or a timestamp in ms")
    p.add_argument("--broadcast", action="store_true", help="broadcasting model (offsets kept locally)")
    p.add_argument("--orderly", action="store_true", help="orderly consumption (queue locks, in order)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--pull", action="store_true", help="read the queues with a pull consumer; commit nothing")
    how.add_argument("--lite", action="store_true", help="poll a lite pull consumer; commit what is printed")
    p.add_argument("--count", "-c", type=int, default=0, help="stop after this many messages (0: no limit)")
    p.add_argument("--idle-timeout", type=float, default=0.0, metavar="SECONDS",
                   help="stop after this long without a message (0: never)")
    p.add_argument("--body-limit", type=int, default=1024, help="show at most this many body bytes (default 1024)")
    add_trace(p)
    p.set_defaults(handler=guarded(run))


def _start(spec: str) -> tuple[str, int | None]:
    if spec == "first":
        return "CONSUME_FROM_FIRST_OFFSET", None
    if spec == "last":
        return "CONSUME_FROM_LAST_OFFSET", None
    if spec.isdigit():
        return "CONSUME_FROM_TIMESTAMP", int(spec)
    raise CliError(f"--from {spec!r}: expected first, last or a timestamp in ms")


class _Printer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.count = 0
        self.last = time.monotonic()
        self.done = asyncio.Event()
        self.told = False           # the waiting line of this quiet spell is out

    def show(self, msg: MessageExt) -> None:
        if self.done.is_set():
            return
        self.count += 1
        self.last = time.monotonic()
        self.told = False
        doc = message_to_json(msg, self.args.body_limit)
        if self.args.json:
            emit(doc)
        else:
            print(f"{msg.topic} {msg.store_host[0]}:{msg.store_host[1]} q{msg.queue_id}@{msg.queue_offset} "
                  f"id={doc['msg_id']} tags={msg.tags or '-'} keys={' '.join(msg.keys) or '-'} "
                  f"reconsume={msg.reconsume_times} body={doc['body']!r}", flush=True)
        if self.args.count and self.count >= self.args.count:
            self.done.set()

    def idle(self) -> bool:
        """Past --idle-timeout without a message; else, once per quiet spell, say on stderr what it waits for."""
        quiet = time.monotonic() - self.last
        if self.args.idle_timeout and quiet >= self.args.idle_timeout:
            return True
        if quiet >= QUIET_SPELL and not self.told and not self.done.is_set():
            self.told = True
            print(self.waiting_line(), file=sys.stderr, flush=True)
        return False

    def waiting_line(self) -> str:
        count, idle = self.args.count, self.args.idle_timeout
        has = f"received {self.count} of {count}; waiting for {count - self.count} more" if count else \
            f"received {self.count}; waiting for more"
        ends = f"stops after {idle:g} s without one, or Ctrl-C" if idle else "Ctrl-C to stop"
        return f"{has} ({ends})"

    async def wait(self) -> None:
        while not self.done.is_set():
            if self.idle():
                return
            try:
                await wait_within(self.done.wait(), 0.1)
            except asyncio.TimeoutError:
                pass


def _model(args: argparse.Namespace) -> MessageModel:
    return MessageModel.BROADCASTING if args.broadcast else MessageModel.CLUSTERING


async def _push(args: argparse.Namespace, printer: _Printer) -> None:
    consume_from, ts = _start(args.start)

    async def listener(msg: MessageExt) -> ConsumeResult:
        printer.show(msg)
        return ConsumeResult.SUCCESS
    consumer = AsyncPushConsumer(_group(args), args.registry, listener=listener, model=_model(args),
                                 consume_from=consume_from, consume_timestamp_ms=ts, orderly=args.orderly,
                                 consume_threads=1, **client_options(args), **trace_options(args))
    consumer.subscribe(args.topic, _selector(args))
    async with consumer:
        await printer.wait()


def _group(args: argparse.Namespace) -> str:
    return args.group or f"smartgo-cli-{os.getpid()}"


async def _lite(args: argparse.Namespace, printer: _Printer) -> None:
    """Each batch is committed once printed; with --count, only up to the last message printed."""
    consume_from, ts = _start(args.start)
    consumer = AsyncLitePullConsumer(_group(args), args.registry, model=_model(args), consume_from=consume_from,
                                     consume_timestamp_ms=ts, auto_commit=False, pull_batch_size=32,
                                     **client_options(args), **trace_options(args))
    consumer.subscribe(args.topic, _selector(args))
    async with consumer:
        while not printer.done.is_set() and not printer.idle():
            batch = await consumer.poll(0.1)
            shown = batch[:args.count - printer.count] if args.count else batch
            for msg in shown:
                printer.show(msg)
            if shown:
                last = shown[-1]
                queue = MessageQueue(last.topic, last.broker_name, last.queue_id)
                await consumer.commit({queue: last.queue_offset + 1})


def _selector(args: argparse.Namespace) -> str | MessageSelector:
    return MessageSelector.by_sql(args.sql) if args.sql else args.expression


async def _pull(args: argparse.Namespace, printer: _Printer) -> None:
    selector = _selector(args)
    async with AsyncPullConsumer(args.group or "smartgo-cli-pull", args.registry, **client_options(args)) as pc:
        queues = await pc.fetch_queues(args.topic)
        offsets = {}
        for q in queues:
            if args.start == "first":
                offsets[q] = await pc.min_offset(q)
            elif args.start == "last":
                offsets[q] = await pc.max_offset(q)
            else:
                at = int(_start(args.start)[1])  # type: ignore[arg-type]  # a timestamp: neither first nor last
                offsets[q] = await pc.search_offset(q, at)

        async def drain(q) -> None:
            while not printer.done.is_set():
                result = await pc.pull_blocking(q, selector, offsets[q], 32, suspend=1.0)
                if result.status is not PullStatus.FOUND:
                    offsets[q] = result.next_begin_offset
                    continue
                for msg in result.messages:
                    printer.show(msg)
                offsets[q] = result.next_begin_offset
        tasks = [asyncio.create_task(drain(q)) for q in queues]
        try:
            await printer.wait()
        finally:
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                raise r


def run(args: argparse.Namespace) -> int:
    if args.pull and (args.broadcast or args.orderly or args.trace):
        raise CliError("--pull reads queues directly; --broadcast, --orderly and --trace apply to the push consumer")
    if args.lite and args.orderly:
        raise CliError("--orderly applies to the push consumer, not --lite")
    _start(args.start)
    printer = _Printer(args)
    run_loop((_pull if args.pull else _lite if args.lite else _push)(args, printer))
    if not args.json:
        print(f"{printer.count} message(s)")
    return 0
