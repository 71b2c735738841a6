"""`smartgo bench produce|consume|e2e|mqtt`: load tests like RocketMQ's benchmark tools, printing TPS
and response times every second (one updating line on a terminal, plain lines otherwise, JSON
lines with --json) and a final summary.

    smartgo bench produce [--topic BenchmarkTest] [--size 128] [--concurrency 16] [--batch 32] [--duration 10]
    smartgo bench consume [--topic BenchmarkTest] [--group G] [--pull]   # --pull: drain the backlog, 32 a pull
    smartgo bench e2e     [--topic BenchmarkTest] [--concurrency 4]     # send -> receipt latency
    smartgo bench mqtt    publish|subscribe|fanout [--port 1883] [--qos 0]  # any MQTT broker (cli/_bench_mqtt.py)

These reproduce the broker issue's figures: batched send (--batch 32 --concurrency 1), single
sync sends from 16 concurrent producers (--concurrency 16), pull from a backlog (consume --pull),
and end-to-end latency (e2e). e2e measures only the messages it sends: its group starts at the
queues' max offsets (after any backlog), and a message counts only if it carries the run's id.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from array import array

from smartgo.cli import _bench_mqtt
from smartgo.cli._common import add_common, client_options as common_options, emit, guarded
from smartgo.cli.errors import CliError
from smartgo.client import AsyncProducer, AsyncPullConsumer, AsyncPushConsumer, ConsumeResult, Message, PullStatus
from smartgo.net.loop import run as run_loop
from smartgo.store.record import MessageExt

#: The user property carrying a `bench e2e` run's id: only the run's own messages are timed.
RUN_PROPERTY = "benchRunId"


def client_options(args: argparse.Namespace) -> dict:
    return {**common_options(args), "busy_poll_us": args.busy_poll_us}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="load-test a cluster (produce, consume, end to end)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="bench_command", metavar="KIND", required=True)
    for kind, text in (("produce", "send as fast as possible"), ("consume", "consume and measure"),
                       ("e2e", "send and consume together; latency from send to receipt")):
        c = kinds.add_parser(kind, help=text, description=text)
        add_common(c)
        c.add_argument("--topic", "-t", default="BenchmarkTest")
        c.add_argument("--duration", "-d", type=float, default=10.0, help="seconds to run (default 10)")
        c.add_argument("--interval", type=float, default=1.0, help="seconds between reports (default 1)")
        if kind in ("produce", "e2e"):
            c.add_argument("--size", "-s", type=int, default=128, help="body bytes (default 128)")
            c.add_argument("--concurrency", "-w", type=int, default=16 if kind == "produce" else 4,
                           help="sends in flight at once (default %(default)s)")
            c.add_argument("--tags", default="TagA")
        if kind == "produce":
            c.add_argument("--batch", type=int, default=1, help="messages per SEND_BATCH_MESSAGE (1: single sends)")
        if kind in ("consume", "e2e"):
            c.add_argument("--group", "-g", default=f"benchmark_consumer_{os.getpid()}")
        if kind == "consume":
            c.add_argument("--pull", action="store_true", help="pull consumer over every queue from its min offset")
        c.add_argument("--busy-poll-us", type=int, default=0, metavar="US",
                       help="keep the client's loop polling this long after each request (0: off; docs/CLIENT.md)")
    _bench_mqtt.add_parser(kinds)
    p.set_defaults(handler=guarded(run))


class Meter:
    """Counts and latencies; report() prints one interval's line."""

    def __init__(self, args: argparse.Namespace, what: str) -> None:
        self.args = args
        self.what = what
        self.count = self.failed = 0
        self.latencies = array("d")
        self._last_count = 0
        self._last_index = 0
        self._start = self._last_time = time.monotonic()
        self._tty = sys.stdout.isatty() and not args.json

    def add(self, latency_ms: float, n: int = 1) -> None:
        self.count += n
        self.latencies.append(latency_ms)

    def report(self) -> None:
        now = time.monotonic()
        span = now - self._last_time
        window = self.latencies[self._last_index:]
        tps = (self.count - self._last_count) / span if span > 0 else 0.0
        avg = sum(window) / len(window) if window else 0.0
        mx = max(window) if window else 0.0
        self._last_count, self._last_index, self._last_time = self.count, len(self.latencies), now
        if self.args.json:
            emit({"type": "interval", "elapsed_s": round(now - self._start, 2), "tps": round(tps, 1),
                  "avg_rt_ms": round(avg, 3), "max_rt_ms": round(mx, 3), "total": self.count, "failed": self.failed})
            return
        line = (f"[{now - self._start:6.1f}s] {self.what} TPS: {tps:9.0f}  Avg RT(ms): {avg:8.3f}  "
                f"Max RT(ms): {mx:8.3f}  Total: {self.count}  Failed: {self.failed}")
        print("\r" + line, end="", flush=True) if self._tty else print(line, flush=True)

    def summary(self) -> dict:
        lat = sorted(self.latencies)
        elapsed = time.monotonic() - self._start

        def pct(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else 0.0
        return {"type": "summary", "kind": self.what, "elapsed_s": round(elapsed, 2), "total": self.count,
                "failed": self.failed, "tps": round(self.count / elapsed, 1) if elapsed else 0.0,
                "avg_rt_ms": round(sum(lat) / len(lat), 3) if lat else 0.0, "p50_rt_ms": pct(0.5),
                "p99_rt_ms": pct(0.99), "max_rt_ms": round(lat[-1], 3) if lat else 0.0}

    def finish(self, **extra: object) -> None:
        s = {**self.summary(), **extra}
        if self.args.json:
            emit(s)
            return
        if self._tty:
            print()
        print(f"{self.what}: {s['total']} in {s['elapsed_s']} s = {s['tps']} msg/s; RT avg {s['avg_rt_ms']} ms, "
              f"p50 {s['p50_rt_ms']}, p99 {s['p99_rt_ms']}, max {s['max_rt_ms']}; failed {s['failed']}")


async def _reporting(meter: Meter, args: argparse.Namespace, work: list[asyncio.Task],
                     stop: asyncio.Event | None = None) -> None:
    """Report every interval for --duration; then set stop and give the work a request timeout
    to end by itself (a send cut off in flight may be stored, uncounted) before cancelling it."""
    deadline = time.monotonic() + args.duration
    while time.monotonic() < deadline and not all(t.done() for t in work):
        await asyncio.sleep(min(args.interval, max(0.0, deadline - time.monotonic())))
        meter.report()
    if stop is not None:
        stop.set()
        await asyncio.wait(work, timeout=args.timeout + 1)
    for t in work:
        t.cancel()
    results = await asyncio.gather(*work, return_exceptions=True)
    errors = [r for r in results if isinstance(r, Exception)]
    if errors:
        raise errors[0]


async def _senders(producer: AsyncProducer, args: argparse.Namespace, meter: Meter, batch: int,
                   stop: asyncio.Event, properties: dict[str, str] | None = None) -> list[asyncio.Task]:
    body = b"x" * args.size
    clock = time.perf_counter  # uvloop's loop.time() has millisecond resolution

    def message() -> Message:
        return Message(args.topic, body, tags=args.tags, properties=dict(properties or {}))

    async def sender() -> None:
        while not stop.is_set():
            t0 = clock()
            try:
                if batch > 1:
                    await producer.send_batch([message() for _ in range(batch)])
                else:
                    await producer.send(message())
            except Exception:
                meter.failed += batch
                await asyncio.sleep(0.01)
                continue
            meter.add((clock() - t0) * 1000, batch)
    await producer.publish_info(args.topic)  # resolve the route (or TBW102) once, before the clock runs
    return [asyncio.create_task(sender()) for _ in range(args.concurrency)]


async def _produce(args: argparse.Namespace) -> None:
    meter = Meter(args, "Send")
    stop = asyncio.Event()
    async with AsyncProducer("benchmark_producer", args.registry, **client_options(args)) as producer:
        await _reporting(meter, args, await _senders(producer, args, meter, args.batch, stop), stop)
    meter.finish()


def _received(meter: Meter, msg: MessageExt) -> None:
    meter.add(time.time() * 1000 - msg.born_timestamp)


async def _consume(args: argparse.Namespace) -> None:
    meter = Meter(args, "Consume")
    if args.pull:
        async with AsyncPullConsumer(args.group, args.registry, **client_options(args)) as pc:
            queues = await pc.fetch_queues(args.topic)

            async def drain(q) -> None:
                offset = await pc.min_offset(q)
                while True:
                    t0 = time.perf_counter()
                    r = await pc.pull(q, "*", offset, 32)
                    offset = r.next_begin_offset
                    if r.status is PullStatus.FOUND:
                        meter.add((time.perf_counter() - t0) * 1000, len(r.messages))
                    elif r.status is PullStatus.NO_NEW_MSG:
                        return
            await _reporting(meter, args, [asyncio.create_task(drain(q)) for q in queues])
    else:
        consumer = AsyncPushConsumer(args.group, args.registry, listener=lambda m: _received(meter, m),
                                     consume_from="CONSUME_FROM_FIRST_OFFSET", **client_options(args))
        consumer.subscribe(args.topic)
        async with consumer:
            await _reporting(meter, args, [asyncio.create_task(asyncio.sleep(args.duration + 1))])
    meter.finish()


async def _start_after_backlog(args: argparse.Namespace) -> tuple[int, int]:
    """Commit the group's offset at every queue's max offset, so that its consumer starts after
    what the topic holds (a new group starts at 0 while a queue's first message is in memory);
    (messages skipped, queues)."""
    async with AsyncPullConsumer(args.group, args.registry, **client_options(args)) as pc:
        queues = await pc.fetch_queues(args.topic)
        ends = await asyncio.gather(*(pc.max_offset(q) for q in queues))
        firsts = await asyncio.gather(*(pc.min_offset(q) for q in queues))
        await asyncio.gather(*(pc.update_consume_offset(q, end) for q, end in zip(queues, ends)))
    return sum(ends) - sum(firsts), len(queues)


async def _e2e(args: argparse.Namespace) -> None:
    run_id = os.urandom(6).hex()
    received: Meter | None = None       # made as the sends start, so that its clock times them alone
    ignored = 0

    async def on_message(msg: MessageExt) -> ConsumeResult:
        nonlocal ignored
        if received is not None and msg.properties.get(RUN_PROPERTY) == run_id:
            _received(received, msg)
        else:
            ignored += 1
        return ConsumeResult.SUCCESS
    async with AsyncProducer("benchmark_producer", args.registry, **client_options(args)) as producer:
        await producer.send(Message(args.topic, b"warm-up"))  # the topic exists before the consumer looks
        skipped, queues = await _start_after_backlog(args)
        if args.json:
            emit({"type": "start", "run_id": run_id, "group": args.group, "topic": args.topic, "queues": queues,
                  "skipped": skipped})
        else:
            print(f"e2e: run {run_id}: only this run's messages count (property {RUN_PROPERTY}); group {args.group} "
                  f"starts after the {skipped} messages already in {args.topic}'s {queues} queues", flush=True)
        consumer = AsyncPushConsumer(args.group, args.registry, listener=on_message, **client_options(args))
        consumer.subscribe(args.topic)
        async with consumer:
            await asyncio.sleep(1.0)  # let the consumer take its queues
            sent, received, stop = Meter(args, "Send"), Meter(args, "Receive(send->receipt)"), asyncio.Event()
            await _reporting(received, args, await _senders(producer, args, sent, 1, stop, {RUN_PROPERTY: run_id}),
                             stop)
            deadline = time.monotonic() + args.timeout      # the last ones sent are still on their way
            while received.count < sent.count and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
    sent.finish()
    received.finish(sent=sent.count, ignored=ignored, run_id=run_id)
    if not args.json:
        print(f"e2e: received {received.count} of the {sent.count} messages this run sent; ignored {ignored} others "
              "(sent before it or by others)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "concurrency", 1) < 1 or getattr(args, "batch", 1) < 1 or args.duration <= 0:
        raise CliError("--concurrency, --batch and --duration must be positive")
    run_loop({"produce": _produce, "consume": _consume, "e2e": _e2e}[args.bench_command](args))
    return 0
