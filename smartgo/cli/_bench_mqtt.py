"""`smartgo bench mqtt publish|subscribe|fanout`: load an MQTT 3.1.1 broker (any: SmartGo's front door,
Mosquitto, ...) with smartgo.mqtt.loadgen, printing rates every second and a summary.

    smartgo bench mqtt publish   [--qos 0] [--publishers 16] [--inflight N]      # msgs/s the broker takes in
    smartgo bench mqtt subscribe [--publishers 1] [--subscribers 1] [--rate 0]  # deliveries/s, publish -> receipt
    smartgo bench mqtt fanout    [--subscribers 1000]                           # one topic, many subscribers

A QoS 0 publish counts once the broker answered the PINGREQ sent after it; QoS 1 on its PUBACK,
QoS 2 on its PUBCOMP (docs in smartgo/mqtt/loadgen.py).
"""

from __future__ import annotations

import argparse
import sys

from smartgo.cli._common import emit
from smartgo.cli.errors import CliError
from smartgo.mqtt.loadgen import QOS0_CHUNK, Load, LoadError, run as run_load

DEFAULTS = {"publish": {"publishers": 16, "subscribers": 0}, "subscribe": {"publishers": 1, "subscribers": 1},
            "fanout": {"publishers": 1, "subscribers": 1000}}


def add_parser(kinds: argparse._SubParsersAction) -> None:
    c = kinds.add_parser("mqtt", help="load an MQTT broker (publish, subscribe, fan-out)", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("scenario", choices=tuple(DEFAULTS))
    c.add_argument("--host", default="127.0.0.1")
    c.add_argument("--port", "-p", type=int, default=1883)
    c.add_argument("--qos", "-q", type=int, choices=(0, 1, 2), default=0, help="of publishes and subscriptions")
    c.add_argument("--seconds", "-d", type=float, default=10.0, help="measured seconds (default 10)")
    c.add_argument("--publishers", type=int, help="publisher connections (default: 16 publish, 1 otherwise)")
    c.add_argument("--subscribers", type=int, help="subscriber connections (default: 0 publish, 1 subscribe, "
                                                   "1000 fanout)")
    c.add_argument("--inflight", type=int, help="publishes unconfirmed over all publishers (QoS 0: in chunks of 64, "
                                                "1 in fanout; default: 256 a publisher at QoS 0, 256 in all at QoS "
                                                "1 and 2, 16 in fanout)")
    c.add_argument("--rate", type=float, default=0.0, help="publishes a second over all publishers (0: flat out)")
    c.add_argument("--size", "-s", type=int, default=128, help="payload bytes (default 128, at least 8)")
    c.add_argument("--processes", type=int, default=2, help="load generator processes (default 2)")
    c.add_argument("--interval", type=float, default=1.0, help="seconds between reports (default 1)")
    c.add_argument("--json", action="store_true", help="JSON lines: one per interval, the summary last")
    c.set_defaults(handler=run)


def load_of(args: argparse.Namespace) -> Load:
    counts = {k: v if getattr(args, k) is None else getattr(args, k) for k, v in DEFAULTS[args.scenario].items()}
    if args.seconds <= 0 or args.processes < 1 or counts["publishers"] < 1 or counts["subscribers"] < 0:
        raise CliError("--seconds, --processes and --publishers must be positive")
    if args.scenario != "publish" and counts["subscribers"] < 1:
        raise CliError(f"{args.scenario} needs a subscriber at least")
    if args.size < 8:
        raise CliError("--size must be 8 at least: the payload carries the send time")
    fan = args.scenario == "fanout"         # as loadgen.fanout: one publish per PINGREQ, 64 a subscriber under way
    backlog = {"publish": 0, "subscribe": 10_000, "fanout": 64}[args.scenario] * counts["subscribers"]
    inflight = args.inflight or (16 if fan else 256 * counts["publishers"] if args.qos == 0 else 256)
    return Load(args.host, args.port, args.seconds, counts["publishers"], counts["subscribers"], args.qos, args.qos,
                inflight, args.rate, args.size, args.processes, one_topic=fan, chunk=1 if fan else QOS0_CHUNK,
                backlog=backlog)


def run(args: argparse.Namespace) -> int:
    load = load_of(args)
    last = [0.0, 0, 0]
    tty = sys.stdout.isatty() and not args.json

    def tick(elapsed: float, accepted: int, delivered: int) -> None:
        span = elapsed - last[0] or 1.0
        msgs_s, deliveries_s = (accepted - last[1]) / span, (delivered - last[2]) / span
        last[:] = [elapsed, accepted, delivered]
        if args.json:
            emit({"type": "interval", "elapsed_s": round(elapsed, 2), "msgs_s": round(msgs_s, 1),
                  "deliveries_s": round(deliveries_s, 1), "accepted": accepted, "delivered": delivered})
            return
        line = (f"[{elapsed:6.1f}s] {args.scenario} msgs/s: {msgs_s:9.0f}  deliveries/s: {deliveries_s:9.0f}  "
                f"accepted: {accepted}  delivered: {delivered}")
        print("\r" + line, end="", flush=True) if tty else print(line, flush=True)
    try:
        result = run_load(load, args.scenario, on_tick=tick, interval=args.interval)
    except (LoadError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        emit({"type": "summary", **result.as_dict()})
        return 0
    if tty:
        print()
    r = result
    print(f"{args.scenario}: {r.accepted} accepted in {r.seconds} s = {r.msgs_s} msgs/s "
          f"(confirmation p50 {r.ack_p50_ms} ms, p99 {r.ack_p99_ms}); sent {r.sent}, "
          f"accepted in all {r.accepted_total}")
    if r.subscribers:
        print(f"{args.scenario}: {r.delivered} deliveries to {r.subscribers} subscribers = {r.deliveries_s} /s "
              f"(publish -> receipt p50 {r.delivery_p50_ms} ms, p99 {r.delivery_p99_ms}); "
              f"in all {r.delivered_total} of {r.expected_deliveries}")
    if r.errors:
        print(f"{args.scenario}: {r.errors} errors: {'; '.join(r.error_lines[:3])}")
    return 0
