"""`smartgo admin` commands about traffic, lag and the clients behind them (mqadmin statsAll,
brokerConsumeStats, producerConnection, getConsumerStatus, queryCq, cloneGroupOffset):

    smartgo admin stats-all [--topic T ...]
    smartgo admin broker-stats --broker ADDR --name TOPIC_PUT_NUMS --key T
    smartgo admin broker-consume-stats --broker ADDR [--order] [--level N]
    smartgo admin consume-time-span --group G --topic T
    smartgo admin client-offsets --group G --topic T [--client ID]
    smartgo admin producer-connections --group G --topic T
    smartgo admin query-cq --topic T --queue N --index I [--count 10] [--group G] [--broker ADDR]
    smartgo admin clone-offset --src G --dest G [--topic T] [--offline]
    smartgo admin system-topics --broker ADDR
"""

from __future__ import annotations

import argparse

from smartgo.cli._common import BROKER, GROUP, TOPIC, CommandTable, emit, options, table, when
from smartgo.client import AsyncAdmin

COMMANDS = CommandTable()
command = COMMANDS.command



@command("stats-all", "messages in and out per topic and consuming group: TPS over the last minute, sums over "
         "the last day (VIEW_BROKER_STATS_DATA; mqadmin statsAll)",
         options((("--topic", "-t"), {"action": "append", "help": "only this topic (repeatable)"})))
async def _stats_all(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    rows = await admin.traffic(args.topic)
    if args.json:
        emit({"traffic": [r.to_json() for r in rows]})
        return
    print(table([(r.topic, r.group or "-", f"{r.tps:.2f}" if r.group is None else "", f"{r.tps:.2f}" if r.group else "",
                  r.day_sum) for r in rows], ("TOPIC", "CONSUMER GROUP", "IN TPS", "OUT TPS", "24H SUM")))


@command("broker-stats", "one stats item of a broker over the last minute, hour and day (VIEW_BROKER_STATS_DATA)",
         options(BROKER, (("--name",), {"required": True, "help": "TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, "
                                        "GROUP_GET_SIZE, BROKER_PUT_NUMS or BROKER_GET_NUMS"}),
                 (("--key",), {"required": True, "help": "the topic, topic@group, or the cluster name"})))
async def _broker_stats(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    stats = await admin.broker_stats(args.broker, args.name, args.key)
    if args.json:
        emit({"name": args.name, "key": args.key, "stats": stats.to_json() if stats else None})
    elif stats is None:
        print(f"{args.broker} has not counted {args.name} {args.key}")
    else:
        print(table([(window, f.sum, f"{f.tps:.2f}", f"{f.avgpt:.2f}") for window, f in
                     (("minute", stats.minute), ("hour", stats.hour), ("day", stats.day))],
                    ("WINDOW", "SUM", "TPS", "PER REQUEST")))


@command("broker-consume-stats", "every group's lag at one broker, per topic and queue (mqadmin brokerConsumeStats)",
         options(BROKER, (("--order",), {"action": "store_true", "help": "only ordered topics"}),
                 (("--level",), {"type": int, "default": 0, "help": "only queues lagging at least this much"})))
async def _broker_consume_stats(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    stats = await admin.broker_consume_stats(args.broker, args.order)
    rows = [(group, q.queue.topic, q.queue.queue_id, q.broker_offset, q.consumer_offset, q.lag, when(q.last_timestamp))
            for group, per_topic in sorted(stats.groups.items()) for s in per_topic for q in s.queues
            if q.lag >= args.level]
    if args.json:
        emit({"broker": stats.broker_addr, "total_diff": stats.total_diff,
              "queues": [dict(zip(("group", "topic", "queue_id", "broker_offset", "consumer_offset", "lag"), r[:6]))
                         for r in rows]})
        return
    print(table(rows, ("GROUP", "TOPIC", "QUEUE", "BROKER OFFSET", "CONSUMER OFFSET", "LAG", "LAST")))
    print(f"total lag {stats.total_diff} at {stats.broker_addr}")


@command("consume-time-span", "per queue the store times of its first and last message, of the group's last "
         "consumed one, and how long its next message has waited (QUERY_CONSUME_TIME_SPAN)", options(GROUP, TOPIC))
async def _consume_time_span(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    spans = await admin.consume_time_span(args.topic, args.group)
    if args.json:
        emit({"group": args.group, "topic": args.topic, "queues": [s.to_json() for s in spans]})
        return
    print(table([(s.queue.broker_name, s.queue.queue_id, when(s.min_timestamp), when(s.max_timestamp),
                  when(s.consume_timestamp), s.delay_ms) for s in spans],
                ("BROKER", "QUEUE", "FIRST", "LAST", "CONSUMED UP TO", "DELAY MS")))


@command("client-offsets", "the offsets each consumer of a group holds in memory for a topic, asked of the "
         "consumers (INVOKE_BROKER_TO_GET_CONSUMER_STATUS; mqadmin getConsumerStatus)",
         options(GROUP, TOPIC, (("--client",), {"default": "", "help": "only this client id"})))
async def _client_offsets(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    held = await admin.client_offsets(args.group, args.topic, args.client)
    rows = [(cid, mq.broker_name, mq.queue_id, offset) for cid, offsets in sorted(held.items())
            for mq, offset in offsets.items()]
    if args.json:
        emit({"group": args.group, "topic": args.topic, "clients": {
            cid: [{"broker_name": mq.broker_name, "queue_id": mq.queue_id, "offset": o} for mq, o in offsets.items()]
            for cid, offsets in held.items()}})
        return
    print(table(rows, ("CLIENT ID", "BROKER", "QUEUE", "OFFSET")))
    print(f"{len(held)} client(s) answered")


@command("producer-connections", "the connected producers of a group (GET_PRODUCER_CONNECTION_LIST)",
         options(GROUP, (("--topic", "-t"), {"required": True, "help": "a topic the group sends to (finds its "
                                             "brokers)"})))
async def _producer_connections(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    conns = await admin.producer_connections(args.group, args.topic)
    if args.json:
        emit({"group": args.group, "connections": conns})
        return
    print(table([(c.get("clientId"), c.get("clientAddr"), c.get("language"), c.get("version")) for c in conns],
                ("CLIENT ID", "ADDRESS", "LANGUAGE", "VERSION")))


@command("query-cq", "raw ConsumeQueue entries of a queue (QUERY_CONSUME_QUEUE; mqadmin queryCq)",
         options(TOPIC, (("--queue", "-q"), {"type": int, "required": True}),
                 (("--index", "-i"), {"type": int, "required": True}),
                 (("--count", "-c"), {"type": int, "default": 10}),
                 (("--group", "-g"), {}), (("--broker", "-b"), {"metavar": "HOST:PORT"})))
async def _query_cq(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    body = await admin.query_consume_queue(args.topic, args.queue, args.index, args.count, args.group, args.broker)
    if args.json:
        emit(body)
        return
    if "queueData" not in body:
        print(body.get("remark") or "no entries")
        return
    print(f"min index {body.get('minQueueIndex')}  max index {body.get('maxQueueIndex')}")
    if "filterData" in body:
        print(f"subscription {body.get('subscriptionData')}  filter {body['filterData']}")
    print(table([(args.index + i, e["physicOffset"], e["physicSize"], e["tagsCode"])
                 for i, e in enumerate(body["queueData"])], ("INDEX", "COMMITLOG OFFSET", "SIZE", "TAGS CODE")))


@command("clone-offset", "copy a group's offsets to another group (CLONE_GROUP_OFFSET)",
         options((("--src",), {"required": True, "help": "the group to copy from"}),
                 (("--dest",), {"required": True, "help": "the group to copy to"}),
                 (("--topic", "-t"), {"help": "only this topic (default: every topic of --src)"}),
                 (("--offline",), {"action": "store_true", "help": "also topics the online --src no longer "
                                   "subscribes"})))
async def _clone_offset(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    addrs = await admin.clone_group_offset(args.src, args.dest, args.topic, args.offline)
    emit({"src": args.src, "dest": args.dest, "brokers": addrs}) if args.json else print(
        f"offsets of {args.src} cloned to {args.dest} on {', '.join(addrs)}")


@command("system-topics", "the topics a broker keeps for itself (GET_SYSTEM_TOPIC_LIST_FROM_BROKER)", options(BROKER))
async def _system_topics(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    topics = await admin.system_topics(args.broker)
    emit({"topics": topics}) if args.json else print("\n".join(topics))
