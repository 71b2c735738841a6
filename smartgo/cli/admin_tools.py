"""`smartgo admin` twins of mqadmin's client-side tools: which clusters serve a topic, how long a
send takes, and how the average strategy would share a topic's queues (mqadmin topicClusterList,
checkMsgSendRT, sendMsgStatus, allocateMQ):

    smartgo admin topic-cluster-list --topic T
    smartgo admin check-msg-send-rt --topic T [--amount 100] [--size 128]
    smartgo admin send-msg-status --broker-name B [--size 128] [--count 50]
    smartgo admin allocate-mq --topic T --ip-list CLIENT_ID,CLIENT_ID,...

The two send checks send real messages (bodies of --size bytes), one at a time, each to one queue
and without retries elsewhere, so each RT is one round trip to one broker. send-msg-status sends to
the topic named after the broker (every broker has one, of one queue, as RocketMQ's with
brokerTopicEnable): only that broker is measured. Neither creates a topic: a topic the registries
do not route is an error, not an auto-creation through TBW102.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from smartgo.cli._common import TOPIC, CommandTable, client_options, emit, options, table
from smartgo.cli.errors import CliError
from smartgo.client import AsyncAdmin, AsyncProducer, Message, MessageQueue, SendResult, allocate_averagely

COMMANDS = CommandTable()
command = COMMANDS.command

#: mqadmin sendMsgStatus's producer group; checkMsgSendRT's is a timestamp, which would leave a new group each run.
PRODUCER_GROUP = "PID_SMSC"
#: The group argument allocateMQ passes: the average strategy does not read it.
ALLOCATE_GROUP = "TOOLS_ALLOCATE_MQ"


def _positive(text: str) -> int:
    """argparse type: an int >= 1 (a send of no bytes, or no sends, measures nothing)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _client_ids(text: str) -> list[str]:
    """argparse type: comma-separated client ids, once each in the order given (a repeated id would
    be given the same queues twice)."""
    ids = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not ids:
        raise argparse.ArgumentTypeError("give at least one client id")
    return ids


SIZE = (("--size", "-s"), {"type": _positive, "default": 128, "help": "body bytes of each message (default 128)"})


@command("topic-cluster-list", "the clusters a topic's brokers belong to (mqadmin topicClusterList)", options(TOPIC))
async def _topic_cluster_list(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    route = await admin.topic_route(args.topic)
    info = await admin.cluster_info()
    names = {b.broker_name for b in route.broker_datas}
    clusters = {c: sorted(names.intersection(brokers)) for c, brokers in sorted(info.clusters.items())
                if names.intersection(brokers)}
    if args.json:
        emit({"topic": args.topic, "clusters": clusters})
        return
    print(table([(c, " ".join(brokers)) for c, brokers in clusters.items()], ("CLUSTER", "BROKERS"))
          if clusters else f"no cluster lists a broker of {args.topic} ({', '.join(sorted(names)) or 'none'})")


@dataclass(frozen=True, slots=True)
class _Timed:
    """One send of a check: the queue it went to, its result or error, its round trip."""
    queue: MessageQueue
    result: SendResult | None
    error: str | None
    rt_ms: float

    def to_json(self) -> dict:
        return {"broker_name": self.queue.broker_name, "queue_id": self.queue.queue_id, "rt_ms": self.rt_ms,
                **(self.result.to_json() if self.result else {"status": "FAILED", "error": self.error})}


async def _timed_sends(args: argparse.Namespace, queues: list[MessageQueue], count: int) -> list[_Timed]:
    """count sends of --size bytes, one at a time, round-robin over queues (checkMsgSendRT's
    selector: send i to queue i % n); a failed send is recorded, not raised, and the next one goes on."""
    body = b"a" * args.size
    out = []
    async with AsyncProducer(PRODUCER_GROUP, args.registry, send_timeout=args.timeout,
                             **client_options(args)) as producer:
        for i in range(count):
            mq = queues[i % len(queues)]
            result, error = None, None
            start = time.perf_counter()
            try:
                result = await producer.send_to_queue(Message(mq.topic, body), mq)
            except Exception as exc:
                error = str(exc) or type(exc).__name__
            out.append(_Timed(mq, result, error, round((time.perf_counter() - start) * 1000, 3)))
    return out


def _average_rt(sends: list[_Timed]) -> float:
    """checkMsgSendRT's average: the first send, which also connects to the broker, is left out."""
    counted = sends[1:] or sends
    return round(sum(s.rt_ms for s in counted) / len(counted), 3)


def _show_sends(args: argparse.Namespace, topic: str, sends: list[_Timed]) -> None:
    """The sends and their average; then CliError (status 1) if any failed, as `smartgo send` does."""
    avg = _average_rt(sends)
    if args.json:
        emit({"topic": topic, "sends": [s.to_json() for s in sends], "avg_rt_ms": avg})
    else:
        print(table([(n, s.queue.broker_name, s.queue.queue_id, s.result.status.name if s.result else "FAILED",
                      s.result.msg_id if s.result else s.error, f"{s.rt_ms:.2f}") for n, s in enumerate(sends, 1)],
                    ("#", "BROKER", "QUEUE", "RESULT", "MSG ID / ERROR", "RT MS")))
        print(f"avg RT {avg:.2f} ms" + (" (the first send, which connects, not counted)" if len(sends) > 1 else ""))
    failed = sum(s.result is None for s in sends)
    if failed:
        raise CliError(f"{failed} of {len(sends)} sends to {topic} failed")


@command("check-msg-send-rt", "send messages one at a time, round-robin over a topic's queues, and show each "
         "send's RT and the average (mqadmin checkMsgSendRT)",
         options(TOPIC, (("--amount", "-a"), {"type": _positive, "default": 100,
                                              "help": "messages to send (default 100)"}), SIZE))
async def _check_msg_send_rt(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    queues = (await admin.topic_route(args.topic)).publish_queues(args.topic)
    if not queues:
        raise CliError(f"topic {args.topic} has no writable queue on a broker with a master")
    _show_sends(args, args.topic, await _timed_sends(args, queues, args.amount))


@command("send-msg-status", "send messages to the topic named after a broker (its own, one queue) and show each "
         "send's result and RT: is that broker taking sends, and how fast (mqadmin sendMsgStatus)",
         options((("--broker-name",), {"required": True, "help": "the broker group (brokerName)"}), SIZE,
                 (("--count", "-c"), {"type": _positive, "default": 50, "help": "messages to send (default 50)"})))
async def _send_msg_status(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    name = args.broker_name
    known = (await admin.cluster_info()).brokers
    if name not in known:
        raise CliError(f"no broker named {name} is registered (known: {', '.join(sorted(known)) or 'none'})")
    queues = [mq for mq in (await admin.topic_route(name)).publish_queues(name) if mq.broker_name == name]
    if not queues:
        raise CliError(f"broker {name}'s topic {name} takes no sends there (no master, or not writable)")
    _show_sends(args, name, await _timed_sends(args, queues, args.count))


@command("allocate-mq", "how the average strategy (the SDK's and Java's default rebalance) shares a topic's read "
         "queues among the given client ids (mqadmin allocateMQ)",
         options(TOPIC, (("--ip-list", "-i"), {"required": True, "type": _client_ids, "dest": "client_ids",
                                               "metavar": "ID,ID,...",
                                               "help": "the consumers' client ids (mqadmin calls them IPs)"})))
async def _allocate_mq(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    mqs = (await admin.topic_route(args.topic)).subscribe_queues(args.topic)     # sorted, as every consumer sorts
    cids = sorted(args.client_ids)
    shares = {cid: allocate_averagely(ALLOCATE_GROUP, cid, mqs, cids) for cid in args.client_ids}
    if args.json:
        emit({"result": {cid: [mq.to_json() for mq in share] for cid, share in shares.items()}})
        return
    print(table([(cid, len(share), " ".join(f"{mq.broker_name}:{mq.queue_id}" for mq in share))
                 for cid, share in shares.items()], ("CLIENT", "QUEUES", "BROKER:QUEUE")))
