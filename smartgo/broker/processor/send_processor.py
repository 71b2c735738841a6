"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) in a net actor.

The processor checks the request (AbstractSendMessageProcessor.msgCheck: topic name, permission,
topic existence or auto-creation through TBW102, queue id), encodes the store record(s) here -
body CRC, born host = the client's socket address, store host = broker_ip:listen_port - and
queues the block for the commit actor. It returns no response: the reply goes out when the
completion comes back (deferred, no task per send). Every send that arrives in one loop
iteration leaves in one ring batch (one doorbell at most).

Replies (SendMessageResponseHeader): msgId = offsetMsgId (comma-joined for a batch), queueId,
queueOffset (the first for a batch), MSG_REGION, TRACE_ON. Under sync flush a stored message is
answered once commitlog.flushed passes its end, or FLUSH_DISK_TIMEOUT after sync_flush_timeout.
Under sync replication (SYNC_MASTER) it also waits for commitlog.slave_acked (FLUSH_SLAVE_TIMEOUT),
and is answered SLAVE_NOT_AVAILABLE at once when no slave is connected or the nearest one is more
than ha_fall_behind_max behind (4.x's handleHA). A slave refuses every write.
While the commit actor restarts sends wait in the ring; only sends that cannot be queued (ring
full beyond BUSY_AFTER, commit down longer than COMMIT_DOWN_BUSY) get SYSTEM_BUSY.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from smartgo.broker.channel import ChannelError
from smartgo.broker.rings import (SEND, STATUS_DISK_FULL, STATUS_FENCED, STATUS_OK, STATUS_QUEUES_FULL, Batcher,
                                  iter_completions, send_prefix)
from smartgo.broker.schedule.schedule_message import half_rewrite, schedule_rewrite, timer_rewrite
from smartgo.broker.settings import delay_levels, is_slave, timer_settings
from smartgo.broker.managers.topics import NOT_ALLOWED_SEND, TopicConfig
from smartgo.broker.processor.turns import Turns
from smartgo.common.acl_sign import FORWARDED_FOR
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager
from smartgo.store.record import (INT16, MAX_PROPERTIES_LENGTH, TRANSACTION_COMMIT_TYPE, TRANSACTION_MASK,
                                  TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE,
                                  append_record, check_sizes, encode_properties, encode_record, pack_host,
                                  topic_field)
from smartgo.store.errors import MessageIllegalError

if TYPE_CHECKING:
    from smartgo.broker.actors.net_actor import NetActor

log = logging.getLogger(__name__)

BUSY_AFTER = 2.0            # s a send may wait for room in the ring before SYSTEM_BUSY
OVERFLOW_POLL = 0.005       # s between attempts to feed a full ring
COMMIT_DOWN_BUSY = 3.0      # s the commit actor may be down before new sends get SYSTEM_BUSY
STALE_IN_RING = 30.0        # s without a completion: answered SYSTEM_BUSY (a lost batch; never seen in tests)
REGION = "DefaultRegion"
BUSY_REMARK = "[REJECTREQUEST]system busy, start flow control for a while"
_V1 = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag", "bornTimestamp",
       "flag", "properties", "reconsumeTimes", "batch")
_V2 = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "m")
# the batch flag: Java's clients write "true"; the C++ client sends its batches as code 10 with "1",
# which Java's broker reads as false (it stores the encoded batch as one message); we read it as a batch
_BATCH_FLAG = ("true", "1")
_BATCH_CODE = int(RequestCode.SEND_BATCH_MESSAGE)     # a plain int: IntEnum compares slowly on the hot path
_V1_CODES = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_REPLY_MESSAGE})     # the others: V2 names
_NOT_QUEUED = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
STORED = (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT,
          ResponseCode.SLAVE_NOT_AVAILABLE)
SLAVE_REMARK = ("service not available now: this broker is a slave; messages are put to its master "
                "(brokerId 0)")
_DELAYABLE = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
_DELAY_PREFIX = "DELAY\x01"
_TIMER_PREFIX = "TIMER_"            # TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS (schedule_message)
_ONS_TIMER = "__STARTDELIVERTIME"
_TRAN_PREFIX = "TRAN_MSG\x01"
_BATCH_ITEM = struct.Struct(">iiiii")      # batch item: TOTALSIZE, MAGIC (0), BODYCRC (0), FLAG, BODYLEN
_WAIT_PREFIX = "WAIT\x01"


@dataclass(slots=True)
class SendHeader:
    group: str
    topic: str
    default_topic: str
    default_queues: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str
    reconsume_times: int
    batch: bool = False


def parse_header(request: RemotingCommand, batches: bool = True) -> SendHeader:
    """SendMessageRequestHeader (V1 names for codes 10 and 324, V2 one-letter names for 310, 320
    and 325); a missing required field is HeaderFieldError "the custom field <name> is null".
    A batch is code 320 or a request whose batch flag is set (Java's broker goes by the flag);
    never with batches=False (ReplyMessageProcessor stores a reply as one message)."""
    code = request.code
    names = _V1 if code in _V1_CODES else _V2
    ext = request.ext_fields or {}      # none at all: the slow path names the first field missing
    batch = batches and (code == _BATCH_CODE or ext.get(names[10]) in _BATCH_FLAG)
    try:
        return SendHeader(ext[names[0]], ext[names[1]], ext[names[2]], int(ext[names[3]]), int(ext[names[4]]),
                          int(ext[names[5]]), int(ext[names[6]]), int(ext[names[7]]), ext.get(names[8]) or "",
                          int(ext.get(names[9]) or 0), batch)
    except (KeyError, ValueError, TypeError):
        r = request   # the slow path only to raise the right error, in field order
        return SendHeader(r.ext_str(names[0]), r.ext_str(names[1]), r.ext_str(names[2]), r.ext_int(names[3]),
                          r.ext_int(names[4]), r.ext_int(names[5]), r.ext_int(names[6]), r.ext_int(names[7]),
                          r.ext_str(names[8], ""), r.ext_int(names[9], 0), batch)


def stored_properties(props: str, cluster_suffix: str) -> tuple[bytes, bool]:
    """The properties string as stored (WAIT dropped, CLUSTER added, as 4.9's
    SendMessageProcessor does) and whether the producer waits for the store (WAIT != false)."""
    wait = True
    if _WAIT_PREFIX in props:
        kept = []
        for seg in props.split("\x02"):
            if seg.startswith(_WAIT_PREFIX):
                wait = seg[len(_WAIT_PREFIX):] != "false"
            elif seg:
                kept.append(seg)
        props = "\x02".join(kept)
    elif props.endswith("\x02"):
        props = props.rstrip("\x02")
    return ((props + "\x02" + cluster_suffix) if props else cluster_suffix).encode(), wait


@dataclass(slots=True)
class PendingSend:
    conn: Connection | None         # None: the broker's own record, answered to `answer` only
    request: RemotingCommand
    queue_id: int
    sizes: list[int]                # record sizes (batch msgIds)
    wait_flush: bool                # answered once durable (sync flush, sync replication)
    born: float = field(default_factory=time.monotonic)
    phys: int = 0                   # once stored (kept while waiting for the flush)
    queue_offset: int = 0
    end: int = 0
    done: bool = False
    topic: str = ""                 # as stored (statistics)
    answer: asyncio.Future | None = None    # gets the response instead of the connection
    counted: bool = True            # in the send statistics (False: the broker's own records)
    no_slave: bool = False          # sync replication without a slave in reach: SLAVE_NOT_AVAILABLE once flushed


class SendProcessor:
    def __init__(self, net: NetActor) -> None:
        cfg = net.config
        self.net = net
        self.view = net.view
        self.ring = net.send_ring
        self.link = net.link
        self.stats = net.stats
        self.store_host = pack_host(cfg.broker_ip, cfg.listen_port)
        self.host_hex = self.store_host.hex().upper()
        self.cluster = f"CLUSTER\x01{cfg.cluster_name}"
        self.cluster_bytes = self.cluster.encode()
        self.max_body = cfg.max_message_size
        self.auto_create = cfg.auto_create_topic
        self.sync_flush = cfg.flush == "sync"
        self.slave = is_slave(cfg)
        self.sync_slave = cfg.replication == "sync" and not self.slave
        self.durable = self.sync_flush or self.sync_slave         # sends wait for a position to pass their end
        self.slave_acked = net.board.scalar("commitlog.slave_acked")
        self.slaves = net.board.scalar("ha.slaves")
        self.fall_behind = cfg.ha_fall_behind_max
        self.flush_timeout = cfg.sync_flush_timeout
        self.broker_name = cfg.broker_name
        self.max_delay_level = len(delay_levels(cfg))
        self.timer = timer_settings(cfg)
        self.pending: dict[int, PendingSend] = {}
        self._ids = itertools.count(1)
        self._id_base = net.ctx.incarnation << 40          # ids of a restarted net actor never repeat
        self._out = Batcher(net.send_ring, self._hand_over)
        self._overflow: deque[tuple[int, bytes, float]] = deque()
        self._overflow_task: asyncio.Task | None = None
        self._born_hosts: dict[str, bytes] = {}
        self._turns = Turns()              # connections with a send waiting for its topic's creation
        self.commit_down_since = 0.0
        # sync flush: heap of (end offset, seq, pending) and the same entries in arrival order
        self._waiting: list[tuple[int, int, PendingSend]] = []
        self._waiting_fifo: deque[PendingSend] = deque()
        self._seq = itertools.count()
        self.flush_wait = net.board.scalar(f"{net.name}.flush_wait", writer=net.name)
        self._in_ring = 0               # sync flush: sends handed to commit and not completed yet

    # ---- the processor --------------------------------------------------------------------------------
    @eager
    async def process(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        h = parse_header(request)
        queue_id = self.check(conn, request, h)
        if queue_id is None or conn in self._turns:
            return await self._in_turn(conn, request, h, queue_id)
        if type(queue_id) is not int:
            return queue_id  # type: ignore[return-value]  # not an int: the refusal
        return self.put(conn, request, h, queue_id)

    async def _in_turn(self, conn: Connection, request: RemotingCommand, h: SendHeader,
                       queue_id: int | RemotingCommand | None) -> RemotingCommand | None:
        """A send that creates its topic first, or one behind such a send on its connection: it is
        stored after the one before it, as 4.x's single send thread stores a connection's sends
        in order (else a send that arrives once the topic table has moved on, but before the
        creating call's answer, would overtake the sends that created the topic)."""
        async with self._turns.turn(conn):
            if queue_id is None:
                queue_id = await self.check_created(conn, request, h)
            if type(queue_id) is not int:
                return queue_id  # type: ignore[return-value]  # not an int: the refusal
            return self.put(conn, request, h, queue_id)

    def check(self, conn: Connection, request: RemotingCommand, h: SendHeader,
              cfg: TopicConfig | None = None) -> int | RemotingCommand | None:
        """msgCheck (AbstractSendMessageProcessor): the queue id the message goes to, or the
        refusal; None for a topic this broker does not have (check_created creates it)."""
        refused = self.refuse_writes(request)
        if refused is not None:
            return refused
        if h.topic in NOT_ALLOWED_SEND:
            return request.make_response(ResponseCode.NO_PERMISSION,
                                         f"Sending message to topic[{h.topic}] is forbidden.")
        if cfg is None:
            cfg = self.view.topic(h.topic)
            if cfg is None:
                return None
        if not cfg.writable:
            return request.make_response(ResponseCode.NO_PERMISSION,
                                         f"the topic[{h.topic}] sending message is forbidden")
        queue_id = h.queue_id
        if queue_id < 0:
            return random.randrange(max(cfg.write_queues, 1))
        if queue_id >= cfg.queue_limit:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"request queueId[{queue_id}] is illegal, "
                                         f"{cfg} Producer: {conn.remote_address}")
        return queue_id

    def refuse_writes(self, request: RemotingCommand) -> RemotingCommand | None:
        """SERVICE_NOT_AVAILABLE on a slave (4.x's putMessage refuses there); NO_PERMISSION while
        the broker takes no writes (brokerPermission without WRITE)."""
        if self.slave:
            return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, SLAVE_REMARK)
        if self.view.read_only.get():
            return self._forbidden(request)
        return None

    def _forbidden(self, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.NO_PERMISSION,
                                     f"the broker[{self.broker_name}] sending message is forbidden")

    async def check_created(self, conn: Connection, request: RemotingCommand, h: SendHeader) -> int | RemotingCommand:
        """check() of a topic this broker does not have: created from its default topic (TBW102) first."""
        cfg = await self._missing_topic(request, h)
        if isinstance(cfg, RemotingCommand):
            return cfg
        return self.check(conn, request, h, cfg)  # type: ignore[return-value]  # with a config, check() decides

    def put(self, conn: Connection, request: RemotingCommand, h: SendHeader, queue_id: int,
            answer: asyncio.Future | None = None) -> RemotingCommand | None:
        """Encode and store a checked message (h is rewritten for a delayed one). None: answered
        on completion, on the connection or, given `answer`, as that future's result."""
        view = self.view
        if view.disk_full.get():
            return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE,
                                         "service not available now: the broker's disk is full; sends are refused "
                                         "until cleanup frees space (pulls go on)")
        if self.commit_down_since and time.monotonic() - self.commit_down_since > COMMIT_DOWN_BUSY \
                and not self.watch_commit():
            return request.make_response(ResponseCode.SYSTEM_BUSY, BUSY_REMARK + " (commit actor restarting)")
        store_queue = queue_id
        try:
            if _TRAN_PREFIX in h.properties and (half := half_rewrite(h.properties, h.topic, queue_id,
                                                                      h.reconsume_times)) is not None:
                if h.batch:
                    raise MessageIllegalError("a batch cannot be a transaction's half message (TRAN_MSG)")
                h.topic, store_queue, h.properties = half
                h.sys_flag &= ~TRANSACTION_MASK
            elif (_DELAY_PREFIX in h.properties or _TIMER_PREFIX in h.properties or _ONS_TIMER in h.properties) \
                    and h.sys_flag & TRANSACTION_MASK in _DELAYABLE:
                store_queue = self._delay(h, queue_id)
            if h.batch:
                block, sizes, wait = self._encode_batch(conn, request, h, store_queue)
            else:
                block, sizes, wait = self._encode_one(conn, request, h, store_queue)
        except MessageIllegalError as exc:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, exc.reason)
        queued = h.sys_flag & TRANSACTION_MASK not in _NOT_QUEUED
        self.store(conn, request, h.topic, queue_id, store_queue if queued else -1, block, sizes, wait, answer)
        return None

    def store(self, conn: Connection | None, request: RemotingCommand, topic: str, queue_id: int, store_queue: int,
              block: bytes, sizes: list[int], wait: bool, answer: asyncio.Future | None = None,
              counted: bool = True) -> None:
        """Hand encoded records to the commit actor; the request is answered on their completion
        (store_queue -1: not put in a ConsumeQueue), or `answer` gets the response. counted=False
        keeps it out of the send statistics (store_own)."""
        req_id = self._id_base | next(self._ids)
        self.pending[req_id] = PendingSend(conn, request, queue_id, sizes,
                                           self.durable and wait and not request.is_oneway, topic=topic,
                                           answer=answer, counted=counted)
        self._out.put(send_prefix(req_id, len(sizes), store_queue, topic.encode()) + block)

    def own_record(self, topic: str, body: bytes, properties: dict[str, str]) -> bytes:
        """A record the broker writes itself: queue 0, born and stored here, now."""
        return encode_record(topic, 0, body, encode_properties(properties), born_timestamp=time.time_ns() // 1_000_000,
                             born_host=self.store_host, store_host=self.store_host)

    def store_own(self, conn: Connection | None, request: RemotingCommand, topic: str, queue_id: int,
                  block: bytes) -> asyncio.Future[RemotingCommand]:
        """Store one record of the broker's own (END_TRANSACTION's, an offset-moved event, a
        given-up half's copy: conn None) for `request`; not in the send statistics, as 4.x puts
        those straight into the store. The future gets the send response."""
        answer = asyncio.get_running_loop().create_future()
        self.store(conn, request, topic, queue_id, queue_id, block, [len(block)], False, answer, counted=False)
        return answer

    def _delay(self, h: SendHeader, queue_id: int) -> int:
        """A message with DELAY > 0 is stored in SCHEDULE_TOPIC_XXXX, queue level - 1, a timer
        message at its first hop (h is rewritten; smartgo.broker.schedule.schedule_message). Its reply still
        names the real queue, with the schedule queue's offset, as RocketMQ's does. A batch cannot
        be delayed."""
        delayed = schedule_rewrite(h.properties, h.topic, queue_id, self.max_delay_level) \
            or timer_rewrite(h.properties, h.topic, queue_id, time.time_ns() // 1_000_000, self.timer)
        if delayed is None:
            return queue_id
        if h.batch:
            raise MessageIllegalError("a batch cannot be delayed (DELAY or a timer property in its header)")
        h.topic, store_queue, h.properties = delayed
        return store_queue

    async def _missing_topic(self, request: RemotingCommand, h: SendHeader) -> TopicConfig | RemotingCommand:
        """An unknown topic: refuse a bad name, else create it from its default topic (TBW102)."""
        try:
            topic_field(h.topic)
        except MessageIllegalError:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The specified topic[{h.topic[:200]}] contains "
                                         "illegal characters or is longer than 127, allowing only ^[%|a-zA-Z0-9_-]+$")
        missing = request.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                        f"topic[{h.topic}] not exist, apply first please!")
        if not self.auto_create or self.view.topic(h.default_topic) is None:
            return missing
        try:
            raw = await self.link.call("create_topic", topic=h.topic, default_topic=h.default_topic,
                                       queues=h.default_queues)
        except ChannelError as exc:
            log.warning("auto-creating topic %s failed: %s", h.topic, exc)
            return request.make_response(ResponseCode.SYSTEM_BUSY, f"{BUSY_REMARK} (topic creation: {exc})")
        if raw is None:
            return missing
        cfg = TopicConfig.from_json(raw)
        self.view.add_topic(cfg)
        return cfg

    # ---- encoding ------------------------------------------------------------------------------------------
    def _born_host(self, conn: Connection, request: RemotingCommand) -> bytes:
        """The producer's address: the connection's, or the one a slave passing the send on names."""
        addr = request.ext_fields.get(FORWARDED_FOR) or conn.remote_address  # type: ignore[union-attr]  # parsed
        packed = self._born_hosts.get(addr)
        if packed is None:
            host, _, port = addr.rpartition(":")
            try:
                packed = pack_host(host, int(port))
            except (ValueError, MessageIllegalError):
                packed = bytes(8)                 # not IPv4 (a unix socket, IPv6): stored as 0.0.0.0:0
            if len(self._born_hosts) > 10_000:
                self._born_hosts.clear()
            self._born_hosts[addr] = packed
        return packed

    def _encode_one(self, conn: Connection, request: RemotingCommand, h: SendHeader,
                    queue_id: int) -> tuple[bytes, list[int], bool]:
        body = request.body
        if body is None:
            body = b""
        elif not isinstance(body, bytes):
            body = request.body_bytes()
        props, wait = stored_properties(h.properties, self.cluster)
        record = encode_record(h.topic, queue_id, body, props, flag=h.flag, sys_flag=h.sys_flag,
                               born_timestamp=h.born_timestamp, born_host=self._born_host(conn, request),
                               store_host=self.store_host, reconsume_times=h.reconsume_times, max_body=self.max_body)
        return record, [len(record)], wait

    def _encode_batch(self, conn: Connection, request: RemotingCommand, h: SendHeader,
                      queue_id: int) -> tuple[bytes, list[int], bool]:
        """MessageExtBatchEncoder: each item {TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN, body,
        PROPLEN, props} becomes a record with the batch header's queue, sys flag, born time and
        hosts, and its own properties plus CLUSTER."""
        data = request.body
        if not data:
            raise MessageIllegalError("the batch body is empty")
        mv = memoryview(data if isinstance(data, (bytes, bytearray)) else request.body_bytes())
        tfield = topic_field(h.topic)
        wait = "WAIT\x01false" not in h.properties
        born_host = self._born_host(conn, request)
        store_host = self.store_host
        sys_flag, born_ts, reconsume = h.sys_flag, h.born_timestamp, h.reconsume_times
        cluster = self.cluster_bytes
        sep_cluster = b"\x02" + cluster
        append, unpack, unpack16 = append_record, _BATCH_ITEM.unpack_from, INT16.unpack_from
        max_body = self.max_body
        parts: list = []
        sizes: list[int] = []
        pos, end = 0, len(mv)
        while pos < end:
            if end - pos < 22:
                raise MessageIllegalError(f"malformed batch body: a truncated item at byte {pos}")
            item_total, _, _, item_flag, body_len = unpack(mv, pos)
            if body_len < 0 or item_total < 22 + body_len or pos + item_total > end:
                raise MessageIllegalError(f"malformed batch body: item sizes (total {item_total}, body {body_len}) "
                                          f"at byte {pos}")
            if body_len > max_body:
                check_sizes(body_len, 0, max_body)
            p = pos + 20 + body_len
            plen = unpack16(mv, p)[0]
            if plen < 0 or 22 + body_len + plen != item_total:
                raise MessageIllegalError(f"malformed batch body: properties length {plen} at byte {pos}")
            if plen:
                props = bytes(mv[p + 2:p + 2 + plen]).rstrip(b"\x02") + sep_cluster
                if len(props) > MAX_PROPERTIES_LENGTH:
                    check_sizes(0, len(props), max_body)
            else:
                props = cluster
            sizes.append(append(parts, mv[pos + 20:p], tfield, props, queue_id, item_flag, sys_flag, born_ts,
                                born_host, store_host, reconsume))
            pos += item_total
        return b"".join(parts), sizes, wait

    # ---- to the commit actor ---------------------------------------------------------------------------------
    def _hand_over(self, out: list[bytes]) -> None:
        """Everything queued during one loop iteration: one ring batch, one doorbell at most; or,
        when this net actor hosts the commit stage, one append, answered at once."""
        stage = self.net.stage
        if stage is not None:
            self._handed_over(len(out))     # as if in a ring: the flush round the append rings for wakes us
            self.on_completions([memoryview(stage.append_local(out))])
            return
        done = 0 if self._overflow else self.ring.try_write(out)
        self._handed_over(done)
        if done < len(out):
            now = time.monotonic()
            self._overflow.extend((SEND.unpack_from(rec)[0], rec, now) for rec in out[done:])
            if self._overflow_task is None or self._overflow_task.done():
                self._overflow_task = asyncio.get_running_loop().create_task(self._drain_overflow())

    async def _drain_overflow(self) -> None:
        """The ring is full (commit busy or restarting): feed it as room appears, and refuse
        what waited too long. The only task that touches the overflow queue while it is not empty."""
        overflow = self._overflow
        while overflow:
            written = self.ring.try_write([rec for _, rec, _ in overflow])
            for _ in range(written):
                overflow.popleft()
            self._handed_over(written)
            self._expire_overflow()
            if overflow:
                await asyncio.sleep(OVERFLOW_POLL)

    def watch_commit(self) -> bool:
        """Is the commit actor up? (Notes since when it is not; a slave has none.)"""
        if self.slave or self.net.stage is not None or self.net.board.actor_running("commit"):
            self.commit_down_since = 0.0
            return True
        if not self.commit_down_since:
            self.commit_down_since = time.monotonic()
        return False

    def _handed_over(self, count: int) -> None:
        """Sync flush: the commit stage leaves landed completions to the flush actor's doorbell,
        so while sends are in the ring (or in a local append) `<me>.flush_wait` asks for a ring after
        every flush round: published before the append, it cannot miss the round the append rings for."""
        if self.sync_flush and count:
            self._in_ring += count
            self._publish_flush_wait()

    def _publish_flush_wait(self) -> None:
        want = 1 if self._in_ring else (self._waiting[0][0] if self._waiting else 0)
        if self.flush_wait.get() != want:
            self.flush_wait.set(want)

    def _expire_overflow(self) -> None:
        now = time.monotonic()
        commit_down = self.commit_down_since and now - self.commit_down_since > COMMIT_DOWN_BUSY
        overflow = self._overflow
        while overflow and (commit_down or now - overflow[0][2] > BUSY_AFTER):
            req_id = overflow.popleft()[0]
            p = self.pending.pop(req_id, None)
            if p is not None:
                self._reply(p, p.request.make_response(ResponseCode.SYSTEM_BUSY, BUSY_REMARK))

    # ---- completions -----------------------------------------------------------------------------------------
    def on_completions(self, records: list[memoryview]) -> None:
        pending = self.pending
        durable = self._durable()
        sync = self.sync_flush
        for mv in records:
            for req_id, status, _count, phys, queue_offset, end in iter_completions(mv):
                p = pending.pop(req_id, None)
                if p is None:
                    continue                      # answered already (a restarted commit repeats a batch)
                if sync and self._in_ring:
                    self._in_ring -= 1
                if status == STATUS_OK:
                    if p.wait_flush and end > durable:
                        if self.sync_slave and not self._slave_ok(end):
                            p.no_slave = True
                            if not self.sync_flush or end <= self.view.flushed.get():
                                self._reply(p, self._stored(p, phys, queue_offset, ResponseCode.SLAVE_NOT_AVAILABLE))
                                continue
                        self._wait_flush(p, phys, queue_offset, end)
                    else:
                        self._reply(p, self._stored(p, phys, queue_offset, ResponseCode.SUCCESS))
                elif status == STATUS_DISK_FULL:
                    self._reply(p, p.request.make_response(
                        ResponseCode.SERVICE_NOT_AVAILABLE, "service not available now: the broker's disk is full"))
                elif status == STATUS_FENCED:           # the fence came up after this send's own check
                    self._reply(p, self._forbidden(p.request))
                elif status == STATUS_QUEUES_FULL:
                    self._reply(p, p.request.make_response(
                        ResponseCode.SYSTEM_ERROR, "the broker cannot open another queue: its queue table is full "
                        f"({self.view.board.queues.limit} queues; the broker's log says how to raise it)"))
                else:
                    self._reply(p, p.request.make_response(
                        ResponseCode.MESSAGE_ILLEGAL, "the message cannot be stored: it does not fit a CommitLog "
                        f"file ({self.net.config.commitlog_file_size} bytes) or is malformed"))
        if self.durable:
            self._publish_flush_wait()

    def _stored(self, p: PendingSend, phys: int, queue_offset: int, code: int) -> RemotingCommand:
        host = self.host_hex                     # offsetMsgId: store host hex + 16 hex digits of the offset
        if len(p.sizes) == 1:
            msg_id = f"{host}{phys:016X}"
        else:
            ids = []
            for size in p.sizes:
                ids.append(f"{host}{phys:016X}")
                phys += size
            msg_id = ",".join(ids)
        return p.request.make_response(code, None, {
            "msgId": msg_id, "queueId": str(p.queue_id), "queueOffset": str(queue_offset),
            "MSG_REGION": REGION, "TRACE_ON": "true"})

    def _reply(self, p: PendingSend, response: RemotingCommand) -> None:
        p.done = True
        if p.answer is not None:
            if not p.answer.done():
                p.answer.set_result(response)
        elif not p.request.is_oneway:
            p.conn.send(response)  # type: ignore[union-attr]  # no answer future: sent on its connection
        if p.counted:                            # statistics: stored messages, and every answer's latency
            if response.code in STORED:
                self.stats.stored(p.topic, len(p.sizes), sum(p.sizes))
            self.stats.send.observe((time.monotonic() - p.born) * 1000.0)

    # ---- sync flush and sync replication ------------------------------------------------------------------
    def _durable(self) -> int:
        """What a waiting send needs to pass its end: the flushed position under sync flush, the
        slave-acknowledged one under sync replication, the lower of the two under both."""
        durable = self.view.flushed.get() if self.sync_flush else 1 << 62
        return min(durable, self.slave_acked.get()) if self.sync_slave else durable

    def _slave_ok(self, end: int) -> bool:
        """HAService.isSlaveOK: a slave is connected and at most ha_fall_behind_max behind."""
        return self.slaves.get() > 0 and end - self.slave_acked.get() < self.fall_behind

    def _wait_flush(self, p: PendingSend, phys: int, queue_offset: int, end: int) -> None:
        p.phys, p.queue_offset, p.end = phys, queue_offset, end
        heapq.heappush(self._waiting, (end, next(self._seq), p))
        self._waiting_fifo.append(p)

    def _ready(self, p: PendingSend, flushed: int, durable: int) -> bool:
        return p.end <= (flushed if p.no_slave else durable)

    def flush_ready(self) -> bool:
        return bool(self._waiting) and self._ready(self._waiting[0][2], self.view.flushed.get(), self._durable())

    def release_flushed(self) -> None:
        flushed = self.view.flushed.get()
        durable = self._durable()
        waiting = self._waiting
        while waiting and self._ready(waiting[0][2], flushed, durable):
            p = heapq.heappop(waiting)[2]
            if not p.done:
                self._answer_flushed(p, ResponseCode.SLAVE_NOT_AVAILABLE if p.no_slave else ResponseCode.SUCCESS)
        self._publish_flush_wait()

    def _answer_flushed(self, p: PendingSend, code: int) -> None:
        self._reply(p, self._stored(p, p.phys, p.queue_offset, code))

    def _timeout_code(self, p: PendingSend) -> int:
        if self.sync_slave and not p.no_slave and p.end > self.slave_acked.get():
            return ResponseCode.FLUSH_SLAVE_TIMEOUT
        return ResponseCode.FLUSH_DISK_TIMEOUT

    def housekeep(self, now: float) -> None:
        """Every 100 ms: FLUSH_DISK_TIMEOUT (FLUSH_SLAVE_TIMEOUT when the slave is what is missing)
        for sends waiting longer than sync_flush_timeout, and a last resort for lost batches."""
        fifo = self._waiting_fifo
        while fifo and (fifo[0].done or now - fifo[0].born > self.flush_timeout):
            p = fifo.popleft()
            if not p.done:
                self._answer_flushed(p, self._timeout_code(p))
        if self._waiting and not fifo:
            self._waiting.clear()
            self._publish_flush_wait()
        stale = [rid for rid, p in self.pending.items() if now - p.born > STALE_IN_RING]
        for rid in stale:
            p = self.pending.pop(rid)
            log.error("send %x got no completion in %.0fs: answering SYSTEM_BUSY", rid, STALE_IN_RING)
            self._reply(p, p.request.make_response(ResponseCode.SYSTEM_BUSY, BUSY_REMARK))

    async def drain(self, timeout: float) -> None:
        """At stop: wait (bounded) for the answers of everything handed to commit."""
        deadline = time.monotonic() + timeout
        while (self.pending or self._waiting) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

