"""Transactional messages (RocketMQ's TransactionMQProducer), the client side.

`AsyncProducer.send_in_transaction(msg, arg)` sends msg as a half message (TRAN_MSG, PGROUP,
sysFlag PREPARED), which no consumer sees; runs the listener's `execute(msg, arg)`, the local
transaction; then tells the broker its outcome with END_TRANSACTION (oneway, as the Java client
does): COMMIT_MESSAGE delivers the message, ROLLBACK_MESSAGE drops it, UNKNOW leaves it to the
broker's check-back, which later asks a producer of the group through `check(msg)`; the answer
goes back the same way. A listener's methods may be plain functions (they run in a worker thread,
so they may block) or coroutine functions. An exception in either counts as UNKNOW, as in Java.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from smartgo.client.message import Message, SendResult, inflate_body
from smartgo.net.codes import FLAG_ONEWAY, RequestCode
from smartgo.net.command import RemotingCommand
from smartgo.store.errors import CorruptRecordError
from smartgo.store.record import (TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE, MessageExt,
                                  decode_record, parse_offset_msg_id)

log = logging.getLogger(__name__)


class LocalTransactionState(enum.Enum):
    """The local transaction's outcome; the value is END_TRANSACTION's commitOrRollback."""

    COMMIT_MESSAGE = TRANSACTION_COMMIT_TYPE
    ROLLBACK_MESSAGE = TRANSACTION_ROLLBACK_TYPE
    UNKNOW = TRANSACTION_NOT_TYPE


class TransactionListener(Protocol):
    def execute(self, msg: Message, arg: object) -> LocalTransactionState | Awaitable[LocalTransactionState]:
        """Run the local transaction of a half message that was stored."""

    def check(self, msg: MessageExt) -> LocalTransactionState | Awaitable[LocalTransactionState]:
        """The broker asks about a half message still open (after a crash, or an UNKNOW)."""


@dataclass(slots=True)
class TransactionSendResult(SendResult):
    local_state: LocalTransactionState = LocalTransactionState.UNKNOW


async def decide(fn: Callable[..., object], *args: object) -> LocalTransactionState:
    """Call a listener method: a coroutine function on the loop, a plain one in a worker thread.
    An exception or an answer that is no LocalTransactionState is UNKNOW (logged)."""
    try:
        state = await fn(*args) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, *args)
    except Exception:
        log.exception("transaction listener %s failed: the state stays UNKNOW", getattr(fn, "__name__", fn))
        return LocalTransactionState.UNKNOW
    if not isinstance(state, LocalTransactionState):
        log.warning("transaction listener %s answered %r, not a LocalTransactionState: UNKNOW", fn, state)
        return LocalTransactionState.UNKNOW
    return state


def end_request(group: str, state: LocalTransactionState, table_offset: int, commit_log_offset: int, msg_id: str,
                transaction_id: str, from_check: bool) -> RemotingCommand:
    """END_TRANSACTION (EndTransactionRequestHeader), oneway."""
    return RemotingCommand(RequestCode.END_TRANSACTION, flag=FLAG_ONEWAY, ext_fields={
        "producerGroup": group, "tranStateTableOffset": str(table_offset), "commitLogOffset": str(commit_log_offset),
        "commitOrRollback": str(state.value), "fromTransactionCheck": "true" if from_check else "false",
        "msgId": msg_id, "transactionId": transaction_id})


def end_after_send(group: str, result: SendResult, state: LocalTransactionState) -> RemotingCommand:
    """END_TRANSACTION for a half message just sent (DefaultMQProducerImpl.endTransaction)."""
    return end_request(group, state, result.queue_offset, parse_offset_msg_id(result.offset_msg_id)[2],
                       result.msg_id, result.msg_id, False)


def checked_message(cmd: RemotingCommand) -> MessageExt:
    """CHECK_TRANSACTION_STATE's body as the message the listener gets. ValueError if it does not decode."""
    try:
        msg = decode_record(cmd.body_bytes())
        inflate_body(msg)
    except (CorruptRecordError, zlib.error) as exc:
        raise ValueError(f"undecodable check body: {exc}") from None
    return msg


def end_after_check(group: str, cmd: RemotingCommand, state: LocalTransactionState) -> RemotingCommand:
    """END_TRANSACTION answering a check (ClientRemotingProcessor.checkTransactionState): the
    check's own offsets and ids."""
    ext = cmd.ext_fields or {}
    msg_id = ext.get("msgId", "")
    return end_request(group, state, int(ext["tranStateTableOffset"]), int(ext["commitLogOffset"]), msg_id,
                       ext.get("transactionId") or msg_id, True)
