"""The pull call both consumers share (Java's PullAPIWrapper): build PULL_MESSAGE for the broker
the last answer suggested, decode the raw store records with the store's own codec, inflate
compressed bodies, re-filter by tag string and stamp MIN_OFFSET / MAX_OFFSET and the broker name on
each message."""

from __future__ import annotations

from smartgo.client import api
from smartgo.client.errors import BrokerError
from smartgo.client.instance import ClientInstance
from smartgo.client.message import MessageQueue, Prop, PullResult, PullStatus, inflate_body
from smartgo.client.subscription import SubscriptionData
from smartgo.net.codes import MASTER_ID, PullSysFlag
from smartgo.net.codes import ResponseCode as R
from smartgo.store.errors import CorruptRecordError
from smartgo.store.record import COMPRESSED_FLAG, iter_records

#: Java's BROKER_SUSPEND_MAX_TIME_MILLIS and the client timeout while suspended.
SUSPEND_MS = 15000
SUSPEND_TIMEOUT = 30.0


def pull_sys_flag(commit_offset: bool, suspend: bool, subscription: bool) -> int:
    """PullSysFlag.buildSysFlag."""
    return ((PullSysFlag.COMMIT_OFFSET if commit_offset else 0) | (PullSysFlag.SUSPEND if suspend else 0)
            | (PullSysFlag.SUBSCRIPTION if subscription else 0))


async def pull(instance: ClientInstance, group: str, mq: MessageQueue, sub: SubscriptionData, offset: int,
               max_nums: int, sys_flag: int, commit_offset: int = 0, suspend_ms: int = SUSPEND_MS,
               timeout: float = SUSPEND_TIMEOUT, broker_id: int = MASTER_ID) -> PullResult:
    addr = instance.broker_addr(mq.broker_name, broker_id)
    if addr is None:
        await instance.update_route(mq.topic)
        addr = await instance.admin_addr(mq.broker_name, mq.topic)
    if broker_id != MASTER_ID:
        sys_flag &= ~PullSysFlag.COMMIT_OFFSET  # only a master takes commits
    cmd = api.pull_request(group, mq.topic, mq.queue_id, offset, max_nums, sys_flag, commit_offset, suspend_ms,
                           sub.sub_string, sub.sub_version, sub.expression_type)
    resp = await instance.invoke(addr, cmd, timeout)
    status, next_begin, min_offset, max_offset, suggested = api.decode_pull(resp, addr)
    result = PullResult(status, next_begin, min_offset, max_offset, [], suggested)
    if status is PullStatus.FOUND and resp.body:
        try:
            msgs = list(iter_records(resp.body_bytes()))
        except CorruptRecordError as exc:
            raise BrokerError(R.SYSTEM_ERROR, f"pull body from {addr} does not decode: {exc}", addr, "pull") from None
        if not sub.takes_all:
            msgs = [m for m in msgs if sub.matches(m)]
        min_text, max_text, broker_name = str(min_offset), str(max_offset), mq.broker_name
        for msg in msgs:
            if msg.sys_flag & COMPRESSED_FLAG:
                inflate_body(msg)
            msg.broker_name = broker_name
            props = msg.properties
            props[Prop.MIN_OFFSET] = min_text
            props[Prop.MAX_OFFSET] = max_text
        result.messages = msgs
    return result
