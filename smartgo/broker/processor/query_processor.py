"""QUERY_MESSAGE (12) and VIEW_MESSAGE_BY_ID (33) in a net actor: records by key, and by offset.

Both answer with raw store records read from the mapped files, bounded by the written position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager

if TYPE_CHECKING:
    from smartgo.broker.net_view import NetView

UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"


class QueryProcessor:
    def __init__(self, view: NetView, default_max_num: int) -> None:
        self.view = view
        self.default_max_num = default_max_num

    @eager
    async def query_message(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """QueryMessageProcessor: newest first, at most maxNum (defaultQueryMaxNum for a UNIQ_KEY query)."""
        topic = request.ext_str("topic")
        key = request.ext_str("key")
        max_num = request.ext_int("maxNum")
        begin = request.ext_int("beginTimestamp")
        end = request.ext_int("endTimestamp")
        if request.ext_bool(UNIQUE_KEY_QUERY, False) or max_num <= 0:
            max_num = self.default_max_num
        found = self.view.fresh_reader().query_by_key(topic, key, max_num, begin, end, self.view.written.get())
        ext = {"indexLastUpdateTimestamp": str(found.index_last_update_timestamp),
               "indexLastUpdatePhyoffset": str(found.index_last_update_phyoffset)}
        if not found.buffers:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND,
                                         "can not find message, maybe time range not correct", ext)
        return request.make_response(ResponseCode.SUCCESS, None, ext, found.buffers)

    @eager
    async def view_message_by_id(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """The record at a CommitLog offset (decoded from an offsetMsgId by the client)."""
        offset = request.ext_int("offset")
        record = self.view.fresh_reader().view(offset, self.view.written.get())
        if record is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return request.make_response(ResponseCode.SUCCESS, None, None, [record])
