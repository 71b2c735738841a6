"""Delayed sends and delivery checks, for the schedule tests and benchmarks/bench_delay.py.

`call` below is any function sending one command to the broker and returning its response
(e.g. a conftest Broker's `call`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from tests.support.broker import offset_command, pull_command, send_command, uniq_key
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import MessageExt, decode_records, parse_offset_msg_id

Call = Callable[[RemotingCommand], RemotingCommand]


def delayed_command(topic: str, body: bytes, level: int | str, *, queue_id: int = 0, uniq: str | None = None,
                    tags: str | None = None, keys: str | None = None,
                    extra: dict[str, str] | None = None) -> RemotingCommand:
    """SEND_MESSAGE_V2 with a DELAY property (and a fresh UNIQ_KEY unless given)."""
    return send_command(topic, body, queue_id=queue_id, uniq=uniq or uniq_key(), tags=tags, keys=keys,
                        extra={"DELAY": str(level), **(extra or {})})


def max_offset(call: Call, topic: str, queue_id: int) -> int:
    answer = call(offset_command(RequestCode.GET_MAX_OFFSET, topic, queue_id))
    return int(answer.ext_fields["offset"])  # type: ignore[index]  # an offset answer has fields


def pull_all(call: Call, topic: str, queue_id: int, offset: int = 0) -> list[MessageExt]:
    """Every message of a queue from offset (up to its max offset now)."""
    out: list[MessageExt] = []
    while True:
        r = call(pull_command(topic, queue_id, offset, subscription="*"))
        if r.code != ResponseCode.SUCCESS:
            return out
        out += decode_records(r.body_bytes(), check_crc=True)
        offset = int(r.ext_fields["nextBeginOffset"])  # type: ignore[index]  # a pull answer has fields


def delivered(call: Call, topic: str, queues: int) -> Counter:
    """UNIQ_KEY -> how many copies the topic's queues hold."""
    return Counter(m.uniq_key for q in range(queues) for m in pull_all(call, topic, q))


def view(call: Call, msg_id: str) -> MessageExt:
    """VIEW_MESSAGE_BY_ID: the record an offsetMsgId points at."""
    offset = str(parse_offset_msg_id(msg_id)[2])
    r = call(RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID, ext_fields={"offset": offset}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return decode_records(r.body_bytes(), check_crc=True)[0]
