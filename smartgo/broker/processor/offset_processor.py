"""GET_MAX_OFFSET (30), GET_MIN_OFFSET (31), GET_EARLIEST_MSG_STORETIME (32) and
SEARCH_OFFSET_BY_TIMESTAMP (29) in a net actor: per-queue positions from the board and the files.
As in RocketMQ these do not check that the topic exists: an unknown queue is empty (0).

UPDATE_CONSUMER_OFFSET (15) is answered here too: the commit goes to the broker actor, which
owns the offsets, coalesced with every other commit of the loop iteration into one channel
record (no round trip per update; a oneway update gets no answer at all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager

if TYPE_CHECKING:
    from smartgo.broker.channel import BrokerLink
    from smartgo.broker.net_view import NetView


class OffsetProcessor:
    def __init__(self, view: NetView, link: BrokerLink) -> None:
        self.view = view
        self.link = link

    @eager
    async def update_consumer_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        """UpdateConsumerOffsetRequestHeader: consumerGroup, topic, queueId, commitOffset."""
        ext = request.ext_fields
        try:
            group, topic = ext["consumerGroup"], ext["topic"]  # type: ignore[index]  # None: TypeError, below
            queue_id, offset = int(ext["queueId"]), int(ext["commitOffset"])  # type: ignore[index]  # as above
        except (KeyError, ValueError, TypeError):     # the slow path only to name the bad field
            group, topic = request.ext_str("consumerGroup"), request.ext_str("topic")
            queue_id, offset = request.ext_int("queueId"), request.ext_int("commitOffset")
        self.link.commit_offset(group, topic, queue_id, offset)
        return None if request.is_oneway else request.make_response(ResponseCode.SUCCESS)

    def _queue(self, request: RemotingCommand) -> tuple[str, int, int]:
        topic = request.ext_str("topic")
        queue_id = request.ext_int("queueId")
        return topic, queue_id, self.view.max_offset(topic, queue_id)

    @eager
    async def get_max_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        _, _, max_offset = self._queue(request)
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": str(max_offset)})

    @eager
    async def get_min_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        topic, queue_id, max_offset = self._queue(request)
        offset = self.view.fresh_reader().min_offset(topic, queue_id, max_offset) if max_offset else 0
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": str(offset)})

    @eager
    async def get_earliest_msg_storetime(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        topic, queue_id, max_offset = self._queue(request)
        ts = self.view.fresh_reader().earliest_message_time(topic, queue_id, max_offset, self.view.written.get())
        return request.make_response(ResponseCode.SUCCESS, None, {"timestamp": str(ts)})

    @eager
    async def search_offset_by_timestamp(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        topic, queue_id, max_offset = self._queue(request)
        timestamp = request.ext_int("timestamp")
        offset = (self.view.fresh_reader().search_offset_by_time(topic, queue_id, timestamp, max_offset,
                                                                  self.view.written.get()) if max_offset else 0)
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": str(offset)})
