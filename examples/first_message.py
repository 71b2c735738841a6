"""Send one message to a SmartGo broker and read it back, with nothing but the remoting layer.

    .venv/bin/python examples/first_message.py [--registry 127.0.0.1:9876] [--topic FirstTopic]

Asks the registry for the topic's route (the topic is created on first send through TBW102),
sends with SEND_MESSAGE_V2, pulls the queue with PULL_MESSAGE and decodes the raw store records
with the same codec the broker stores them with. The client SDK (`smartgo send/consume`)
replaces all of this with one call each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import PullSysFlag, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import decode_records, encode_properties


def route(client: BlockingRemotingClient, registry: str, topic: str) -> tuple[str, int] | None:
    """(broker address, write queue count) of the topic's first master, None if unknown."""
    answer = client.invoke(registry, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic}))
    if answer.code != ResponseCode.SUCCESS:
        return None
    data = json.loads(answer.body_bytes())
    broker = data["brokerDatas"][0]
    queues = next(q for q in data["queueDatas"] if q["brokerName"] == broker["brokerName"])
    return broker["brokerAddrs"]["0"], queues["writeQueueNums"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", default="127.0.0.1:9876")
    parser.add_argument("--topic", default="FirstTopic")
    parser.add_argument("--body", default="Hello SmartGo")
    args = parser.parse_args()
    with BlockingRemotingClient() as client:
        # The topic may not exist yet: any broker of the default topic TBW102 creates it on first send.
        found = route(client, args.registry, args.topic) or route(client, args.registry, "TBW102")
        if found is None:
            print(f"no broker registered at {args.registry}: is the node running?", file=sys.stderr)
            return 1
        broker, _ = found
        props = encode_properties({"TAGS": "TagA", "KEYS": "first", "UNIQ_KEY": os.urandom(16).hex().upper()})
        send = RemotingCommand(RequestCode.SEND_MESSAGE_V2, body=args.body.encode(), ext_fields={
            "a": "first_producer", "b": args.topic, "c": "TBW102", "d": "4", "e": "0", "f": "0",
            "g": str(int(time.time() * 1000)), "h": "0", "i": props.decode()})
        sent = client.invoke(broker, send)
        if sent.code != ResponseCode.SUCCESS:
            print(f"send failed: code {sent.code}: {sent.remark}", file=sys.stderr)
            return 1
        ext = sent.ext_fields
        print(f"sent: msgId {ext['msgId']} queue {ext['queueId']} offset {ext['queueOffset']} via {broker}")
        pull = RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields={
            "consumerGroup": "first_consumer", "topic": args.topic, "queueId": ext["queueId"],
            "queueOffset": ext["queueOffset"], "maxMsgNums": "32", "commitOffset": "0",
            # suspend (long poll) | subscription in the request: no consumer heartbeat needed
            "sysFlag": str(PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION), "subscription": "*",
            "expressionType": "TAG", "suspendTimeoutMillis": "3000", "subVersion": "0"})
        pulled = client.invoke(broker, pull, timeout=10.0)   # a long poll: waits until the message is dispatched
        if pulled.code != ResponseCode.SUCCESS:
            print(f"pull found nothing: code {pulled.code}: {pulled.remark}", file=sys.stderr)
            return 1
        for msg in decode_records(pulled.body_bytes()):
            print(f"read: {msg.body.decode()!r} tags {msg.tags} keys {msg.keys} store time {msg.store_timestamp} "
                  f"msgId {msg.msg_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
