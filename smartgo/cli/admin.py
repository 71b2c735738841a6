"""`smartgo admin <command>`: topics, clusters, consumer groups and messages (mqadmin's jobs).

    smartgo admin topic-create --topic T [--queues 8] [--perm 6] [--order] [--cluster C | --broker ADDR]
    smartgo admin topic-update ...            (same options; UPDATE_AND_CREATE_TOPIC)
    smartgo admin topic-delete --topic T [--cluster C]
    smartgo admin topic-list | topic-route --topic T | topic-status --topic T | cluster-list
    smartgo admin topic-consumers --topic T
    smartgo admin consumer-progress --group G [--topic T] | consumer-connections --group G
    smartgo admin consumer-status --group G [--client ID] [--jstack]
    smartgo admin consume-directly --group G --client ID --id MSG_ID [--topic T]
    smartgo admin reset-offset --group G --topic T --to (MS | 2026-11-23T10:00 | end) [--no-force]
    smartgo admin group-create --group G [--retry-max-times 16] [--cluster C]
    smartgo admin group-delete --group G [--cluster C | --broker ADDR] [--remove-offsets]
    smartgo admin query-key --topic T --key K | query-id --id ID [--topic T]
    smartgo admin query-offset --topic T --queue N --offset N [--broker-name B]
    smartgo admin broker-runtime --broker ADDR | broker-config --broker ADDR
    smartgo admin elect-master --broker-name B [--broker ADDR | --broker-id ID]
    smartgo admin dlq-list --group G [--max 32] [--offset 0]
    smartgo admin dlq-resend --group G (--id ID [--id ID ...] | --all) [--topic T]
    smartgo admin tx-given-up [--max 32] [--offset 0] | tx-resume --id ID [--topic T]
    smartgo admin trace --id ID [--trace-topic T] [--max 64]

Traffic, lag and the clients behind them (smartgo.cli.admin_stats):

    smartgo admin stats-all [--topic T ...] | broker-stats --broker ADDR --name N --key K
    smartgo admin broker-consume-stats --broker ADDR [--order] [--level N]
    smartgo admin consume-time-span --group G --topic T | client-offsets --group G --topic T [--client ID]
    smartgo admin producer-connections --group G --topic T
    smartgo admin query-cq --topic T --queue N --index I [--count 10] [--group G] [--broker ADDR]
    smartgo admin clone-offset --src G --dest G [--topic T] [--offline] | system-topics --broker ADDR

Taking brokers out of service and back, brokers' and registries' settings (smartgo.cli.admin_maintenance):

    smartgo admin wipe-write-perm --broker-name B | add-write-perm --broker-name B
    smartgo admin broker-config-update --key K --value V (--broker ADDR | --cluster C)
    smartgo admin kv-update --namespace NS --key K --value V | kv-delete ... | kv-get ...
    smartgo admin delete-expired-commitlog | clean-expired-cq [--broker ADDR | --cluster C]
    smartgo admin registry-config | registry-config-update --key orderMessageEnable --value true

mqadmin's client-side tools: where a topic lives, send RTs, a queue allocation (smartgo.cli.admin_tools):

    smartgo admin topic-cluster-list --topic T | allocate-mq --topic T --ip-list ID,ID,...
    smartgo admin check-msg-send-rt --topic T [--amount 100] [--size 128]
    smartgo admin send-msg-status --broker-name B [--size 128] [--count 50]

Access control, each broker's plain_acl.yml (smartgo.cli.admin_acl):

    smartgo admin acl-update --account AK [--account-secret SK] [--admin | --no-admin] [--topic-perms T=PUB,..] ...
    smartgo admin acl-delete --account AK | acl-white --addrs P,... | acl-version | acl-config --broker ADDR

MQTT devices, asked of each broker's MQTT actors (smartgo.cli.admin_mqtt):

    smartgo admin mqtt-clients | mqtt-sessions [--client PREFIX] [--limit 100] [--broker ADDR | --cluster C]
    smartgo admin mqtt-subscriptions [--client PREFIX] [--filter PREFIX] | mqtt-kick --client ID
"""

from __future__ import annotations

import argparse
import datetime

from smartgo.cli import admin_acl, admin_maintenance, admin_mqtt, admin_stats, admin_tools
from smartgo.cli._common import (BROKER, GROUP, TOPIC, CommandTable, add_common, broker_or_cluster, client_options,
                                 emit, guarded, options, table, when)
from smartgo.client import AsyncAdmin
from smartgo.client.errors import ClientError
from smartgo.client.message import message_to_json
from smartgo.client.trace import TRACE_TOPIC, TraceRecord, TraceType, consume_end, trace_to_json
from smartgo.net.codes import TRANS_CHECK_MAX_TIME_TOPIC
from smartgo.net.loop import run as run_loop
from smartgo.store.record import MessageExt

COMMANDS = CommandTable()
command = COMMANDS.command
#: every `smartgo admin` command, in --help's order: this module's, then those kept in modules of their own
_TABLES = (COMMANDS, admin_stats.COMMANDS, admin_maintenance.COMMANDS, admin_tools.COMMANDS, admin_acl.COMMANDS,
           admin_mqtt.COMMANDS)

OPTIONAL_TOPIC: tuple[tuple[str, ...], dict[str, object]] = (("--topic", "-t"), {})
CLUSTER: tuple[tuple[str, ...], dict[str, object]] = (("--cluster", "-c"), {})
MAX = (("--max",), {"type": int, "default": 32})
OFFSET = (("--offset",), {"type": int, "default": 0})


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("admin", help="administer topics, groups and messages", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    cmds = p.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND", required=True)
    for commands in _TABLES:
        for name, (help_text, configure, handler) in commands.items():
            c = cmds.add_parser(name, help=help_text.replace("%", "%%"), description=help_text)
            add_common(c)
            configure(c)
            c.set_defaults(admin_handler=handler)
    p.set_defaults(handler=guarded(run))


def _create_options(c: argparse.ArgumentParser) -> None:
    """topic-create's and topic-update's options: a function, not options(), for the --cluster | --broker group."""
    options(TOPIC)(c)
    c.add_argument("--queues", "-q", type=int, default=8, help="read (and write) queue count (default 8)")
    c.add_argument("--write-queues", type=int, help="write queue count if different")
    c.add_argument("--perm", type=int, default=6, help="permission bits: 2 write, 4 read, 6 both (default)")
    c.add_argument("--order", action="store_true", help="an ordered topic: its brokers and write queues in the "
                                                        "registries' ORDER_TOPIC_CONFIG too (mqadmin updateTopic -o)")
    broker_or_cluster(c)


async def _create_topic(admin: AsyncAdmin, args: argparse.Namespace, done: str) -> None:
    """One request (UPDATE_AND_CREATE_TOPIC) behind both commands; only the word printed differs."""
    addrs = await admin.create_topic(args.topic, args.queues, write_queues=args.write_queues, perm=args.perm,
                                     order=args.order, cluster=args.cluster, broker_addr=args.broker)
    emit({"topic": args.topic, "brokers": addrs}) if args.json else print(f"{done} {args.topic} on {', '.join(addrs)}")


@command("topic-create", "create a topic on brokers", _create_options)
async def _topic_create(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    await _create_topic(admin, args, "created")


@command("topic-update", "update a topic's settings", _create_options)
async def _topic_update(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    await _create_topic(admin, args, "updated")


@command("topic-delete", "delete a topic from the brokers and registries", options(TOPIC, CLUSTER))
async def _topic_delete(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    addrs = await admin.delete_topic(args.topic, args.cluster)
    emit({"topic": args.topic, "brokers": addrs}) if args.json else print(
        f"deleted {args.topic} from {', '.join(addrs)} and the registries")


@command("topic-list", "list every topic the registries know", options())
async def _topic_list(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    topics = await admin.topic_list()
    emit({"topics": topics}) if args.json else print("\n".join(topics) or "(no topics)")


@command("topic-route", "show a topic's route", options(TOPIC))
async def _topic_route(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    route = await admin.topic_route(args.topic)
    if args.json:
        emit(route.to_json())
        return
    print(table([(b.broker_name, b.cluster, " ".join(f"{k}={v}" for k, v in sorted(b.broker_addrs.items())))
                 for b in route.broker_datas], ("BROKER", "CLUSTER", "ADDRESSES")))
    print(table([(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas],
                ("BROKER", "READ", "WRITE", "PERM")))


@command("topic-status", "show each queue's min and max offset", options(TOPIC))
async def _topic_status(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    stats = await admin.topic_status(args.topic)
    if args.json:
        emit({"topic": args.topic, "queues": [s.to_json() for s in stats]})
        return
    print(table([(s.queue.broker_name, s.queue.queue_id, s.min_offset, s.max_offset, when(s.last_update_timestamp))
                 for s in stats], ("BROKER", "QUEUE", "MIN", "MAX", "LAST UPDATED")))


@command("topic-consumers", "the groups that consume a topic, with their lag", options(TOPIC))
async def _topic_consumers(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    rows: list[dict] = []
    for group in await admin.topic_consumers(args.topic):
        stats = await admin.consumer_progress(group, args.topic)
        rows.append({"group": group, "total_lag": stats.total_lag, "consume_tps": stats.consume_tps,
                     "last": max((q.last_timestamp for q in stats.queues), default=0)})
    if args.json:
        emit({"topic": args.topic, "groups": rows})
        return
    print(table([(r["group"], r["total_lag"], f"{r['consume_tps']:.1f}", when(r["last"])) for r in rows],
                ("GROUP", "LAG", "TPS", "LAST CONSUMED")))


@command("cluster-list", "show clusters and brokers (with runtime figures when brokers answer)", options())
async def _cluster_list(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    info = await admin.cluster_info()
    runtime = {}
    for addr in sorted({a for b in info.brokers.values() for a in b.broker_addrs.values()}):
        try:
            runtime[addr] = await admin.broker_runtime_info(addr)
        except Exception as exc:  # an older broker without the code still lists
            runtime[addr] = {"error": str(exc)}
    if args.json:
        emit({**info.to_json(), "runtime": runtime})
        return
    rows = []
    for cluster, names in sorted(info.clusters.items()):
        for name in names:
            b = info.brokers.get(name)
            addrs = b.broker_addrs if b else {}
            master_end = runtime.get(addrs.get(0, ""), {}).get("commitLogMaxOffset")
            for bid, addr in sorted(addrs.items()):
                rt = runtime.get(addr, {})
                rows.append((cluster, name, bid, addr, rt.get("brokerVersionDesc", rt.get("version", "-")),
                             rt.get("failoverEpoch", "-"), rt.get("putTps", "-"),
                             rt.get("getTransferedTps", rt.get("getTps", "-")),
                             _behind(bid, master_end, rt.get("commitLogMaxOffset"))))
    print(table(rows, ("CLUSTER", "BROKER", "ID", "ADDRESS", "VERSION", "EPOCH", "PUT TPS", "GET TPS",
                       "SLAVE BEHIND")))


def _behind(broker_id: int, master_end: str | None, end: str | None) -> str:
    """A slave's distance from its master: CommitLog bytes the master has and it has not yet."""
    if broker_id == 0 or master_end is None or end is None:
        return "-"
    return f"{max(0, int(master_end) - int(end))} B"


@command("consumer-progress", "a group's offsets and lag per queue", options(GROUP, OPTIONAL_TOPIC))
async def _consumer_progress(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    stats = await admin.consumer_progress(args.group, args.topic)
    if args.json:
        emit({"group": args.group, "consume_tps": stats.consume_tps, "total_lag": stats.total_lag,
              "queues": [q.to_json() for q in stats.queues]})
        return
    print(table([(q.queue.topic, q.queue.broker_name, q.queue.queue_id, q.broker_offset, q.consumer_offset, q.lag,
                  when(q.last_timestamp)) for q in stats.queues],
                ("TOPIC", "BROKER", "QUEUE", "BROKER OFFSET", "CONSUMER OFFSET", "LAG", "LAST")))
    print(f"consume TPS {stats.consume_tps:.1f}  total lag {stats.total_lag}")


@command("consumer-connections", "a group's connected clients and subscriptions", options(GROUP))
async def _consumer_connections(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    conn = await admin.consumer_connections(args.group)
    if args.json:
        emit(conn)
        return
    print(table([(c.get("clientId"), c.get("clientAddr"), c.get("language"), c.get("version"))
                 for c in conn.get("connectionSet", [])], ("CLIENT ID", "ADDRESS", "LANGUAGE", "VERSION")))
    print(f"consumeType={conn.get('consumeType')} messageModel={conn.get('messageModel')} "
          f"consumeFromWhere={conn.get('consumeFromWhere')}")
    for topic, sub in sorted((conn.get("subscriptionTable") or {}).items()):
        print(f"  {topic}: {sub.get('subString') if isinstance(sub, dict) else sub}")


@command("consumer-status", "what each consumer of a group reports of itself: settings, queues held with "
         "their commit offsets and caches, pull and consume rates (GET_CONSUMER_RUNNING_INFO)",
         options(GROUP, (("--client",), {"help": "only this client id (default: every connected one)"}),
                 (("--jstack",), {"action": "store_true", "help": "with each client's thread stacks"})))
async def _consumer_status(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    """mqadmin consumerStatus: each client's running info, and whether every client subscribes
    alike (ConsumerRunningInfo.analyzeSubscription). A client that cannot answer is listed with
    the reason; the others still are."""
    ids = [args.client] if args.client else sorted(
        c["clientId"] for c in (await admin.consumer_connections(args.group)).get("connectionSet", []))
    clients = []
    for client_id in ids:
        try:
            clients.append({"client_id": client_id, **(await admin.consumer_running_info(
                args.group, client_id, args.jstack)).to_json()})
        except ClientError as exc:
            clients.append({"client_id": client_id, "error": str(exc)})
    subs = [sorted((s.get("topic"), s.get("subString")) for s in c["subscriptions"])
            for c in clients if "error" not in c]
    same = all(s == subs[0] for s in subs)
    if args.json:
        emit({"group": args.group, "same_subscriptions": same, "clients": clients})
        return
    for c in clients:
        print(f"== {c['client_id']}")
        if "error" in c:
            print(f"   cannot tell: {c['error']}")
            continue
        p = c["properties"]
        print(f"   {p.get('PROP_CONSUME_TYPE', '?')} orderly={p.get('PROP_CONSUMEORDERLY', '?')} "
              f"threads={p.get('PROP_THREADPOOL_CORE_SIZE', '?')} version={p.get('PROP_CLIENT_VERSION', '?')} "
              f"since {when(int(p.get('PROP_CONSUMER_START_TIMESTAMP', 0) or 0))}")
        print("   subscribes " + ", ".join(f"{s.get('topic')} ({s.get('subString')})" for s in c["subscriptions"]))
        if c["queues"]:
            print(table([(q["topic"], q["broker_name"], q["queue_id"], q.get("commitOffset"), q.get("cachedMsgCount"),
                          when(_ms(q.get("lastPullTimestamp"))), when(_ms(q.get("lastConsumeTimestamp"))))
                         for q in c["queues"]],
                        ("TOPIC", "BROKER", "QUEUE", "COMMIT OFFSET", "CACHED", "LAST PULL", "LAST CONSUME")))
        if c["status"]:
            print(table([(topic, st.get("pullTPS"), st.get("pullRT"), st.get("consumeOKTPS"),
                          st.get("consumeFailedTPS"), st.get("consumeRT"), st.get("consumeFailedMsgs"))
                         for topic, st in sorted(c["status"].items())],
                        ("TOPIC", "PULL TPS", "PULL RT MS", "OK TPS", "FAILED TPS", "CONSUME RT MS", "FAILED 1H")))
        if c.get("jstack"):
            print(c["jstack"])
    print(f"{len(clients)} client(s); subscriptions {'the same on every client' if same else 'DIFFER between clients'}")


def _ms(value: object) -> int:
    return value if isinstance(value, int) else 0


@command("consume-directly", "have one consumer of a group run its listener on a message, outside its queues "
         "(nothing is committed or retried; CONSUME_MESSAGE_DIRECTLY)",
         options(GROUP, (("--client",), {"required": True, "help": "the consumer's client id"}),
                 (("--id", "-i"), {"required": True, "dest": "msg_id",
                                   "help": "offsetMsgId, or UNIQ_KEY with --topic"}),
                 OPTIONAL_TOPIC))
async def _consume_directly(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    result = await admin.consume_message_directly(args.group, args.client, args.msg_id, args.topic)
    emit(result) if args.json else print(f"{result.get('consumeResult')} in {result.get('spentTimeMills')} ms"
                                         + (f"\n{result['remark']}" if result.get("remark") else ""))


def _point_in_time(text: str) -> int:
    """-1 for end (the broker's sign for the end of each queue), else milliseconds since the epoch."""
    if text == "end":
        return -1
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither milliseconds, an ISO 8601 time nor end") from None


@command("reset-offset", "move a group's offsets in a topic to a point in time (consume again, or skip)",
         options(GROUP, TOPIC,
                 (("--to",), {"required": True, "type": _point_in_time, "metavar": "MS|ISO-TIME|end",
                              "help": "milliseconds since the epoch, an ISO 8601 time (local unless it names a zone), "
                                      "or end (the end of each queue)"}),
                 (("--no-force",), {"dest": "force", "action": "store_false",
                                    "help": "only move offsets backwards (never skip messages)"})))
async def _reset_offset(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    moved = await admin.reset_offset_by_time(args.group, args.topic, args.to, args.force)
    if args.json:
        emit({"group": args.group, "topic": args.topic, "timestamp": args.to,
              "queues": [{"broker_name": mq.broker_name, "queue_id": mq.queue_id, "offset": offset}
                         for mq, offset in moved.items()]})
        return
    print(table([(mq.broker_name, mq.queue_id, offset) for mq, offset in moved.items()],
                ("BROKER", "QUEUE", "NEW OFFSET")))


@command("group-create", "create or update a subscription group",
         options(GROUP, (("--retry-max-times",), {"type": int, "default": 16}), CLUSTER,
                 (("--no-broadcast",), {"action": "store_true", "help": "refuse broadcasting consumers"})))
async def _group_create(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    addrs = await admin.create_subscription_group(args.group, cluster=args.cluster,
                                                  retry_max_times=args.retry_max_times,
                                                  broadcast_enable=not args.no_broadcast)
    emit({"group": args.group, "brokers": addrs}) if args.json else print(
        f"group {args.group} set on {', '.join(addrs)}")


def _group_delete_options(c: argparse.ArgumentParser) -> None:
    """group-delete's options: a function, not options(), for --cluster | --broker."""
    options(GROUP)(c)
    broker_or_cluster(c)
    c.add_argument("--remove-offsets", action="store_true", help="forget the group's consumer offsets too")


@command("group-delete", "delete a subscription group, and its retry and dead-letter topics (mqadmin deleteSubGroup)",
         _group_delete_options)
async def _group_delete(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    addrs = await admin.delete_subscription_group(args.group, cluster=args.cluster, broker_addr=args.broker,
                                                  remove_offsets=args.remove_offsets)
    emit({"group": args.group, "brokers": addrs}) if args.json else print(
        f"group {args.group} deleted from {', '.join(addrs)}")


@command("query-key", "find messages by business key",
         options(TOPIC, (("--key", "-k"), {"required": True}), MAX))
async def _query_key(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _messages(args, await admin.query_by_key(args.topic, args.key, args.max))


@command("query-id", "find a message by msgId (offsetMsgId, or UNIQ_KEY with --topic)",
         options((("--id", "-i"), {"required": True, "dest": "msg_id"}), OPTIONAL_TOPIC))
async def _query_id(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _messages(args, await admin.query_by_id(args.msg_id, args.topic))


@command("query-offset", "show the message at (topic, queue, offset)",
         options(TOPIC, (("--queue",), {"type": int, "required": True}),
                 (("--offset",), {"type": int, "required": True}), (("--broker-name",), {})))
async def _query_offset(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _messages(args, [await admin.query_by_offset(args.topic, args.queue, args.offset, args.broker_name)])


@command("broker-runtime", "a broker's runtime info (GET_BROKER_RUNTIME_INFO)", options(BROKER))
async def _broker_runtime(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _key_values(args, await admin.broker_runtime_info(args.broker))


@command("broker-config", "a broker's configuration (GET_BROKER_CONFIG)", options(BROKER))
async def _broker_config(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _key_values(args, await admin.broker_config(args.broker))


@command("elect-master", "hand a broker name's master role to one of its slaves, the named one or the most advanced "
         "(failover registry; 5.x electMaster)",
         options((("--broker-name",), {"required": True}), (("--broker", "-b"), {"metavar": "HOST:PORT"}),
                 (("--broker-id",), {"type": int})))
async def _elect_master(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    if args.broker is not None and args.broker_id is not None:
        raise ClientError("name the slave with --broker HOST:PORT or --broker-id ID, not both")
    _key_values(args, await admin.elect_master(args.broker_name, args.broker, args.broker_id))


def _key_values(args: argparse.Namespace, kv: dict[str, str]) -> None:
    emit(kv) if args.json else print(table(sorted(kv.items()), ("KEY", "VALUE")))


@command("dlq-list", "browse a consumer group's dead-letter queue (%DLQ%<group>)", options(GROUP, MAX, OFFSET))
async def _dlq_list(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _messages(args, await admin.dlq_messages(args.group, args.max, args.offset))


def _dlq_resend_options(c: argparse.ArgumentParser) -> None:
    """dlq-resend's options: a function, not options(), for the required --id | --all group."""
    options(GROUP)(c)
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", "-i", action="append", dest="msg_ids", metavar="ID",
                       help="a DLQ message's offsetMsgId or UNIQ_KEY (repeatable)")
    which.add_argument("--all", action="store_true", help="every message of the DLQ (up to --max)")
    c.add_argument("--max", type=int, default=1024)
    c.add_argument("--topic", "-t", help="send to this topic instead of the original one (RETRY_TOPIC)")


@command("dlq-resend", "send dead-letter messages again to their original topic", _dlq_resend_options)
async def _dlq_resend(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    sent = await admin.dlq_resend(args.group, None if args.all else args.msg_ids, to_topic=args.topic,
                                  max_num=args.max)
    if args.json:
        emit({"group": args.group, "resent": [{"dlq_msg_id": m.msg_id, "topic": args.topic or
                                               m.properties.get("RETRY_TOPIC"), "offset_msg_id": new}
                                              for m, new in sent]})
        return
    for m, new in sent:
        print(f"{m.msg_id} -> {args.topic or m.properties.get('RETRY_TOPIC')} {new}")
    print(f"{len(sent)} message(s) resent")


@command("tx-given-up", "transaction half messages the check-back gave up on (TRANS_CHECK_MAX_TIME_TOPIC)",
         options(MAX, OFFSET))
async def _tx_given_up(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    _messages(args, await admin.given_up_halves(args.max, args.offset))


@command("tx-resume", "have a given-up transaction checked again: its half is put back and its producer group "
         "asked anew (RESUME_CHECK_HALF_MESSAGE)",
         options((("--id", "-i"), {"required": True, "dest": "msg_id",
                                   "help": "offsetMsgId of the given-up copy or of the half, or the transaction's "
                                           "msgId (UNIQ_KEY), looked up in --topic"}),
                 (("--topic", "-t"), {"default": TRANS_CHECK_MAX_TIME_TOPIC,
                                      "help": "where a UNIQ_KEY is looked up (default: %(default)s)"})))
async def _tx_resume(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    resumed = await admin.resume_half(args.msg_id, args.topic)
    emit({"resumed": resumed}) if args.json else print(f"{resumed} put back: its transaction will be checked again")


@command("trace", "a traced message's trace: its send, each consumer group's consumptions, its transaction's "
         "end (mqadmin queryMsgTraceById)",
         options((("--id", "-i"), {"required": True, "dest": "msg_id", "help": "the message's msgId (UNIQ_KEY)"}),
                 (("--trace-topic",), {"default": TRACE_TOPIC, "help": "default: %(default)s"}),
                 (("--max",), {"type": int, "default": 64, "help": "trace messages read at most (default 64)"})))
async def _trace(admin: AsyncAdmin, args: argparse.Namespace) -> None:
    records = await admin.message_trace(args.msg_id, args.trace_topic, args.max)
    if args.json:
        emit({"trace": [trace_to_json(r) for r in records]})
        return
    if not records:
        print(f"no trace of {args.msg_id} in {args.trace_topic}")
        return
    sections = {"Pub": ("#ProducerGroup", "#SendTime"), "Sub": ("#ConsumerGroup", "#ConsumeTime"),
                "EndTransaction": ("#ProducerGroup", "#Time")}
    for kind, (group_head, time_head) in sections.items():
        rows = [_trace_row(kind, r) for r in records if _TRACE_KINDS.get(r.type) == kind]
        if rows:
            print(table(rows, ("#Type", group_head, "#ClientHost", time_head, "#CostTime", "#Status", "#Detail")))
            print()


_TRACE_KINDS = {TraceType.PUB: "Pub", TraceType.SUB_AFTER: "Sub", TraceType.END_TRANSACTION: "EndTransaction"}


def _trace_row(kind: str, rec: TraceRecord) -> tuple:
    status = "success" if rec.success else "failed"
    if rec.type is TraceType.END_TRANSACTION:
        status, detail = rec.transaction_state, "from a check" if rec.from_check else "after the send"
    elif rec.type is TraceType.PUB:
        detail = f"topic={rec.topic} store={rec.store_host} offsetMsgId={rec.offset_msg_id}"
    else:
        detail = f"retry={rec.retry_times} end={consume_end(rec.context_code)}"
    return kind, rec.group or "-", rec.client_host, when(rec.timestamp), f"{rec.cost_ms}ms", status, detail


def _messages(args: argparse.Namespace, msgs: list[MessageExt]) -> None:
    if args.json:
        emit({"messages": [message_to_json(m) for m in msgs]})
        return
    for m in msgs:
        doc = message_to_json(m, 256)
        print(f"{m.topic} q{m.queue_id}@{m.queue_offset} msgId={doc['msg_id']} offsetMsgId={m.msg_id}\n"
              f"  tags={m.tags or '-'} keys={' '.join(m.keys) or '-'} born={when(m.born_timestamp)} "
              f"stored={when(m.store_timestamp)} store={m.store_host[0]}:{m.store_host[1]} "
              f"reconsume={m.reconsume_times}\n  properties={m.properties}\n  body={doc['body']!r}")
    print(f"{len(msgs)} message(s)")


def run(args: argparse.Namespace) -> int:
    run_loop(_run(args))
    return 0


async def _run(args: argparse.Namespace) -> None:
    """Every command needs one admin client, opened and closed here; the subcommand's parser set its handler."""
    async with AsyncAdmin(args.registry, **client_options(args)) as admin:
        await args.admin_handler(admin, args)
