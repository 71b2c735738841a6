"""Cleanups an operator asks for now: DELETE_EXPIRED_COMMITLOG 329 (5.x, mqadmin
deleteExpiredCommitLog) and CLEAN_EXPIRED_CONSUMEQUEUE 306 (mqadmin cleanExpiredCQ).

The cleanup actor is the only one that deletes store files, so the broker actor only counts the
request on the board (`cleanup.<kind>_asked`) and answers once the cleanup actor has served it
(`cleanup.<kind>_done`), within REQUEST_WAIT. 5.x answers 329 before anything is deleted; waiting
lets the caller read the new CommitLog minimum right after the answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from smartgo.broker.channel import ClientRef
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand

if TYPE_CHECKING:
    from smartgo.broker.actors.broker_actor import BrokerActor

REQUEST_WAIT = 2.0      # s; under the net actor's wait for a forwarded answer (3 s)
POLL = 0.02
KINDS: dict[int, tuple[str, str]] = {
    RequestCode.DELETE_EXPIRED_COMMITLOG: ("commitlog", "CommitLog files older than file_reserved_hours"),
    RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE: ("queues", "ConsumeQueue and index files below the CommitLog minimum")}


class CleanupProcessor:
    CODES = dict.fromkeys(KINDS, "ask")

    def __init__(self, broker: BrokerActor) -> None:
        self.b = broker
        board = broker.board
        self.fields = {kind: (board.scalar(f"cleanup.{kind}_asked", writer=broker.name),
                              board.scalar(f"cleanup.{kind}_done")) for kind, _ in KINDS.values()}

    async def ask(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        kind, what = KINDS[request.code]
        asked, done = self.fields[kind]
        n = asked.get() + 1
        asked.set(n)
        self.b.log.info("%s asked to delete the %s", client.addr, what)
        deadline = time.monotonic() + REQUEST_WAIT
        while done.get() < n:
            if time.monotonic() > deadline:
                self.b.log.warning("the cleanup actor has not deleted the %s within %gs; it will", what, REQUEST_WAIT)
                return request.make_response(ResponseCode.SUCCESS, f"asked; the {what} are deleted at the cleanup "
                                             f"actor's next turn (not done within {REQUEST_WAIT:g}s)")
            await asyncio.sleep(POLL)
        return request.make_response(ResponseCode.SUCCESS)
