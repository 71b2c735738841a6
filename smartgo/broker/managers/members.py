"""The consumer groups' members, persisted, so that a restarted node answers for them at once.

4.x keeps a group's members only in memory: after a restart GET_CONSUMER_LIST_BY_GROUP answers
"no consumer for this group" and pulls SUBSCRIPTION_NOT_EXIST until each client's next heartbeat
(every 30 s), so push consumers of the C++ and Java clients pull nothing for up to 30 s. The broker
actor writes each group's client ids, message model, consume type and subscriptions to
<store>/config/consumerMembers.json (persist.py: atomic, with a .bak) when they changed, at most
once per PERSIST_INTERVAL; a restarted broker actor takes them back as *presumed* members
(ClientTable.restore) for `presumed_member_ttl` seconds. A presumed member has no connection: it
is in the consumer id list and its subscriptions serve pulls, but it gets no notification and no
admin query lists it (GET_CONSUMER_CONNECTION_LIST, running info, consumer status). Its first real
heartbeat turns it into an ordinary member; one that sends none within the TTL leaves the group
then, and the group's other consumers are notified.

While the node stops or restarts (node.state STOPPING / RESTARTING) the file is no longer written:
the net actors stop first and close every connection, which would empty the table a clean restart
should bring back.

A file that does not parse (nor its .bak) is logged and read as no members: the clients register
again with their next heartbeat, as without this file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from smartgo.broker.managers.clients import ConsumerGroupInfo
from smartgo.common.bodies import BodyError, Fields, parse_body
from smartgo.common.heartbeat import CONSUME_FROM, CONSUME_TYPES, MODELS, SubscriptionData, parse_subscription
from smartgo.common.persist import PersistedFile
from smartgo.net import fastjson

FILE = Path("config") / "consumerMembers.json"
PERSIST_INTERVAL = 0.1          # s between checks for a changed member table (a write only when it changed)


@dataclass(frozen=True, slots=True)
class SavedGroup:
    """What a restarted broker actor takes back of one consumer group."""
    name: str
    consume_type: str
    message_model: str
    consume_from_where: str
    client_ids: tuple[str, ...]
    subscriptions: tuple[SubscriptionData, ...]

    def to_json(self) -> dict:
        return {"consumeType": self.consume_type, "messageModel": self.message_model,
                "consumeFromWhere": self.consume_from_where, "clientIds": list(self.client_ids),
                "subscriptionDataSet": [s.to_json() for s in self.subscriptions]}


def saved_groups(consumers: Iterable[ConsumerGroupInfo]) -> list[SavedGroup]:
    """The table as it is persisted: every group with its members, real and presumed."""
    return [SavedGroup(info.name, info.consume_type, info.message_model, info.consume_from_where,
                       tuple(info.member_ids()), tuple(info.subscriptions[t] for t in sorted(info.subscriptions)))
            for info in consumers]


def encode(groups: list[SavedGroup]) -> bytes:
    return fastjson.dumps({"consumerGroups": {g.name: g.to_json() for g in sorted(groups, key=lambda g: g.name)}})


def parse(raw: bytes) -> list[SavedGroup]:
    """consumerMembers.json (BodyError names the first bad field)."""
    body = "consumerMembers.json"
    table = Fields(parse_body(raw, body).obj.get("consumerGroups", {}), "consumerGroups", body).obj
    groups = []
    for name, obj in table.items():
        f = Fields(obj, name, body)
        ids = f.array("clientIds", [])
        if not ids or not all(isinstance(i, str) and i for i in ids):
            raise BodyError(f"{body}: {name}.clientIds must be a non-empty list of client ids")
        groups.append(SavedGroup(name, f.enum("consumeType", CONSUME_TYPES, "CONSUME_PASSIVELY"),
                                 f.enum("messageModel", MODELS, "CLUSTERING"),
                                 f.enum("consumeFromWhere", CONSUME_FROM, "CONSUME_FROM_LAST_OFFSET"),
                                 tuple(ids), tuple(parse_subscription(s) for s in f.objects("subscriptionDataSet"))))
    return groups


class MemberFile:
    """config/consumerMembers.json: written only when its content changes."""

    def __init__(self, store_path: Path) -> None:
        self.file = PersistedFile(store_path / FILE)
        self._saved: bytes | None = None

    def load(self) -> list[SavedGroup]:
        """The saved groups; none when there is no file, or it and its backup are corrupt (logged)."""
        groups = self.file.load(parse, "consumer members")
        if groups is not None:
            self._saved = encode(groups)
        return groups or []

    def save(self, consumers: Iterable[ConsumerGroupInfo]) -> bool:
        """Write the table if it differs from what was written last; True when it was written."""
        data = encode(saved_groups(consumers))
        if data == self._saved:
            return False
        self.file.save(data)
        self._saved = data
        return True
