"""Transaction halves the check-back gave up on: their copy in TRANS_CHECK_MAX_TIME_TOPIC, and
RESUME_CHECK_HALF_MESSAGE (323), which puts one back to be checked again. Both run in a net actor,
which reads the half from the mapped files and stores through the send path.

4.x: a half still open after transaction_check_max checks is given up
(DefaultTransactionalMessageCheckListener.resolveDiscardMsg): a copy goes to
TRANS_CHECK_MAX_TIME_TOPIC queue 0 (created on demand, one queue), where an operator or a consumer
finds it (AsyncAdmin.given_up_halves, `smartgo admin tx-given-up`). Here the check-back in the
broker actor logs the give-up and hands the copy to a net actor (event "given_up"). 323
(AdminBrokerProcessor.resumeCheckHalfMessage) stores the record an offsetMsgId names - the copy or
the original half - in RMQ_SYS_TRANS_HALF_TOPIC queue 0 again: a new half, which the next pass
checks with a fresh count (its born time is the producer's, long past the transaction timeout).
Both copies keep body, flag, sys flag, born time and host, store host, reconsume times and every
property, with TRANSACTION_CHECK_TIMES set to the checks made (the copy) or 0 (the resumed half).

Departures, each where 4.x misbehaves: 4.x puts back whatever record the offset names, and reads
only the offset of the msgId. Here the record must be a half or its copy (REAL_TOPIC and REAL_QID:
anything else would become a half no producer can end), and the msgId must be that record's own
(its store host too: an id of another broker would name an unrelated record here). 4.x answers
every refusal with one fixed remark; here the remark gives the reason after it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from smartgo.broker.schedule.schedule_message import HALF_TOPIC, ScheduleRecordError, half_copy
from smartgo.net.codes import TRANS_CHECK_MAX_TIME_TOPIC, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager
from smartgo.store.errors import CorruptRecordError, InvalidMessageIdError
from smartgo.store.record import decode_record

if TYPE_CHECKING:
    from smartgo.broker.actors.net_actor import NetActor

log = logging.getLogger(__name__)

PUT_FAILED = f"Put message back to {HALF_TOPIC} failed."
REFUSED = f"Exception was thrown when putting message back to {HALF_TOPIC}."
# what the broker's own copy of a given-up half is stored for: no client waits on it
_GIVEN_UP_REQUEST = RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE)


class ResumeHalfProcessor:
    def __init__(self, net: NetActor) -> None:
        self.net = net

    @eager
    async def process(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        msg_id = request.ext_str("msgId", "")
        refused = self.net.sends.refuse_writes(request)
        if refused is not None:
            return refused
        try:
            block = self._half(msg_id)
        except ValueError as exc:
            log.warning("RESUME_CHECK_HALF_MESSAGE %r from %s refused: %s", msg_id, conn.remote_address, exc)
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"{REFUSED} {exc}")
        response = await self.net.sends.store_own(conn, request, HALF_TOPIC, 0, block)
        if response.code != ResponseCode.SUCCESS:
            log.warning("RESUME_CHECK_HALF_MESSAGE %s from %s: not stored: %s", msg_id, conn.remote_address,
                        response.remark)
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"{PUT_FAILED} {response.remark}")
        log.info("half message %s put back in %s by %s: checked again from the next pass (now %s)", msg_id,
                 HALF_TOPIC, conn.remote_address, response.ext_fields["msgId"])  # type: ignore[index]  # stored
        return request.make_response(ResponseCode.SUCCESS)

    def _half(self, msg_id: str) -> bytes:
        """The half record to store for msg_id; ValueError says why there is none."""
        view = self.net.view
        try:
            record = view.fresh_reader().view_by_offset_msg_id(msg_id, view.written.get())
        except InvalidMessageIdError as exc:
            raise ValueError(f"bad msgId: {exc}") from None
        if record is None:
            raise ValueError(f"no message {msg_id} in this broker's CommitLog")
        try:
            stored_id = decode_record(record, with_body=False).msg_id
            block = half_copy(record, HALF_TOPIC, 0)
        except (CorruptRecordError, ScheduleRecordError) as exc:
            raise ValueError(f"{msg_id} is not a transaction half message: {exc}") from None
        if stored_id.upper() != msg_id.upper():
            raise ValueError(f"{msg_id} names another broker: the message at its offset here is {stored_id}")
        return block

    def given_up(self, args: dict) -> None:
        """The broker actor's "given_up" event: copy the half at CommitLog offset args["phys"] to
        TRANS_CHECK_MAX_TIME_TOPIC."""
        phys, checks = args["phys"], args["checks"]
        view = self.net.view
        record = view.fresh_reader().view(phys, view.written.get())
        try:
            if record is None:
                raise ScheduleRecordError("no record there (deleted?)")
            block = half_copy(record, TRANS_CHECK_MAX_TIME_TOPIC, checks)
        except ScheduleRecordError as exc:
            log.error("the half message at CommitLog offset %d was given up and cannot be copied to %s: %s", phys,
                      TRANS_CHECK_MAX_TIME_TOPIC, exc)
            return
        stored = self.net.sends.store_own(None, _GIVEN_UP_REQUEST, TRANS_CHECK_MAX_TIME_TOPIC, 0, block)
        stored.add_done_callback(lambda fut: self._copied(fut.result(), phys))

    @staticmethod
    def _copied(response: RemotingCommand, phys: int) -> None:
        if response.code == ResponseCode.SUCCESS:
            log.info("the given-up half message at CommitLog offset %d is copied to %s as %s", phys,
                     TRANS_CHECK_MAX_TIME_TOPIC, response.ext_fields["msgId"])  # type: ignore[index]  # stored
        else:
            log.error("the given-up half message at CommitLog offset %d was not copied to %s: %s", phys,
                      TRANS_CHECK_MAX_TIME_TOPIC, response.remark)
