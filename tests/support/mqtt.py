"""MQTT test harness: a broker to test against (a SmartGo node, or Mosquitto to compare), paho-mqtt
clients whose callbacks become things to wait on, and programs read line by line.

The broker is a SmartGo node unless SMARTGO_MQTT_TEST_BROKER=mosquitto: then the same tests run
against Mosquitto (Debian's package), which is how they were checked to assert what MQTT says rather
than what SmartGo happens to do. Debian builds Mosquitto without WebSocket support, so against it
`ws_port` is WebSocketBridge, a small RFC 6455 relay to its TCP port.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import os
import queue
import re
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.debian import need
from tests.support.waits import LOOPBACK, end_process, free_ports, wait_for_port

BROKER_ENV = "SMARTGO_MQTT_TEST_BROKER"
BROKERS = ("smartgo", "mosquitto")
WAIT = 20.0                 # seconds: the default deadline of every wait here (a loaded 2-CPU CI host)


def broker_kind() -> str:
    """The broker the MQTT tests run against: $SMARTGO_MQTT_TEST_BROKER, default smartgo."""
    kind = os.environ.get(BROKER_ENV, "smartgo").strip().lower() or "smartgo"
    if kind not in BROKERS:
        raise ValueError(f"{BROKER_ENV}={kind!r}: use one of {', '.join(BROKERS)}")
    return kind


def unique(prefix: str) -> str:
    """A fresh name (client id, topic level): tests share one broker."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ---- brokers -----------------------------------------------------------------------------------------------

@dataclass
class Broker:
    """An MQTT broker on loopback: `port` speaks MQTT over TCP, `ws_port` over WebSocket at /mqtt."""
    kind: str
    port: int
    ws_port: int
    stop: Callable[[], None]
    node: Any = None            # the SmartGo node (tests.support.nodes.Node), None for Mosquitto
    log: Path | None = None
    host: str = LOOPBACK

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.ws_port}/mqtt"


def start_mqtt_broker(folder: Path, settings: dict | None = None) -> Broker:
    """The broker broker_kind() names; settings are extra node settings (SmartGo only)."""
    if broker_kind() == "mosquitto":
        return start_mosquitto(folder)
    return start_smartgo(folder, settings)


def start_smartgo(folder: Path, settings: dict | None = None) -> Broker:
    """A SmartGo master node (embedded registry) with its MQTT listeners on free loopback ports."""
    from tests.support.broker import start_broker
    port, ws_port = free_ports(2)
    node = start_broker(folder, {"mqtt_port": port, "mqtt_ws_port": ws_port, **(settings or {})})
    try:
        for p in (port, ws_port):
            wait_for_port(p, timeout=WAIT)
    except BaseException:
        node.reap()
        raise
    return Broker("smartgo", port, ws_port, node.reap, node=node, log=node.store / "logs" / "node.log")


MOSQUITTO_CONF = """\
listener {port} {host}
allow_anonymous true
persistence false
max_queued_messages 10000
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
log_type notice
log_type information
"""


def start_mosquitto(folder: Path, attempts: int = 3) -> Broker:
    """Mosquitto (installed with apt-get when missing) on a free loopback port, in memory only."""
    binary = need("mosquitto", "mosquitto")
    folder.mkdir(parents=True, exist_ok=True)
    for attempt in itertools.count(1):
        port = free_ports(1)[0]
        conf, log = folder / f"mosquitto-{port}.conf", folder / f"mosquitto-{port}.log"
        conf.write_text(MOSQUITTO_CONF.format(port=port, host=LOOPBACK))
        with open(log, "wb") as err:
            proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=err,
                                    stdin=subprocess.DEVNULL)
        try:
            wait_for_port(port, timeout=WAIT)
            break
        except AssertionError:
            proc.kill()
            proc.wait(10)
            if attempt >= attempts:
                raise AssertionError(f"mosquitto did not listen on {port}:\n{log.read_text()[-2000:]}") from None
    bridge = WebSocketBridge(port)

    def stop() -> None:
        bridge.close()
        end_process(proc)
    return Broker("mosquitto", port, bridge.port, stop, log=log)


class WebSocketBridge:
    """MQTT over WebSocket (RFC 6455, path /mqtt, subprotocol mqtt) relayed to a broker's TCP port, on its
    own thread: for Mosquitto, which Debian builds without WebSocket support."""

    GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True, name="ws-bridge")
        self.thread.start()
        if not started.wait(WAIT):
            raise AssertionError("the WebSocket bridge did not start")

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, LOOPBACK, 0))
        self.port = self.server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()
        self.loop.close()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(WAIT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.partition(":") for line in request.split("\r\n")[1:] if line)}
            path = request.split(" ")[1] if " " in request else ""
            protocols = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
            if path != "/mqtt" or "mqtt" not in protocols or "sec-websocket-key" not in headers:
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + self.GUID).digest())
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.upstream)
            try:
                down = asyncio.ensure_future(self._downstream(up_reader, writer))
                await self._upstream(reader, writer, up_writer)
                down.cancel()
            finally:
                up_writer.close()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        up: asyncio.StreamWriter) -> None:
        """Client frames (masked) to the broker as bytes; ping answered, close ends the relay."""
        while True:
            head = await reader.readexactly(2)
            opcode, size = head[0] & 0x0F, head[1] & 0x7F
            if size == 126:
                size = struct.unpack(">H", await reader.readexactly(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", await reader.readexactly(8))[0]
            mask = await reader.readexactly(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(await reader.readexactly(size)))
            if opcode == 0x8:
                writer.write(b"\x88\x00")
                return
            if opcode == 0x9:
                writer.write(_ws_frame(0xA, data))
            elif opcode in (0x0, 0x2):
                up.write(data)
                await up.drain()

    @staticmethod
    async def _downstream(up: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await up.read(65536):
                writer.write(_ws_frame(0x2, data))
                await writer.drain()
        finally:
            writer.close()


def _ws_frame(opcode: int, data: bytes) -> bytes:
    n = len(data)
    head = bytes([0x80 | opcode, n]) if n < 126 else \
        struct.pack(">BBH", 0x80 | opcode, 126, n) if n < 65536 else struct.pack(">BBQ", 0x80 | opcode, 127, n)
    return head + data


# ---- paho-mqtt clients ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Received:
    """A message a client got: properties keyed by MQTT 5.0 snake_case names (user_property a list of pairs)."""
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ConnAck:
    reason: int
    session_present: bool
    properties: dict[str, Any]


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False
    properties: dict[str, Any] = field(default_factory=dict)


def snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def properties_dict(props: Properties | None) -> dict[str, Any]:
    """paho Properties as a dict keyed by snake_case names (UserProperty -> user_property)."""
    if props is None:
        return {}
    return {snake(name.replace(" ", "")): getattr(props, name.replace(" ", ""))
            for name in props.names if hasattr(props, name.replace(" ", ""))}


def paho_properties(packet: int, values: dict[str, Any] | None) -> Properties | None:
    """A paho Properties for a packet type (PacketTypes.PUBLISH, ...) from snake_case names."""
    if not values:
        return None
    props = Properties(packet)
    for name, value in values.items():
        setattr(props, "".join(part.capitalize() for part in name.split("_")), value)
    return props


class Collector:
    """Messages as they arrive, from a client's network thread; waits with deadlines."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[Received] = []

    def add(self, item: Received) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def all(self) -> list[Received]:
        with self._cond:
            return list(self._items)

    def wait_for(self, done: Callable[[list[Received]], bool], timeout: float = WAIT,
                 what: str = "messages") -> list[Received]:
        """Every message so far, once done(them) holds; AssertionError naming what was got after timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not done(self._items):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}; got "
                                         f"{[(m.topic, m.payload[:40]) for m in self._items]}")
                self._cond.wait(left)
            return list(self._items)

    def take(self, n: int, timeout: float = WAIT) -> list[Received]:
        """The first n messages (waiting for them)."""
        return self.wait_for(lambda items: len(items) >= n, timeout, f"{n} messages")[:n]

    def until(self, payload: bytes, timeout: float = WAIT) -> list[Received]:
        """Every message up to and including the first whose payload is `payload` (a marker)."""
        got = self.wait_for(lambda items: any(m.payload == payload for m in items), timeout,
                            f"the marker {payload!r}")
        return got[:next(i for i, m in enumerate(got) if m.payload == payload) + 1]


class _Results:
    """Answers by packet id from the network thread (SUBACK, PUBACK...), for the thread that waits."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._got: dict[int, Any] = {}

    def put(self, mid: int, value: Any) -> None:
        with self._cond:
            self._got[mid] = value
            self._cond.notify_all()

    def wait(self, mid: int, timeout: float, what: str, gone: threading.Event) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while mid not in self._got:
                left = deadline - time.monotonic()
                if left <= 0 or gone.is_set():
                    raise AssertionError(f"no {what} (packet id {mid}) in {timeout}s"
                                         + (" : the connection closed" if gone.is_set() else ""))
                self._cond.wait(min(left, 0.2))
            return self._got.pop(mid)


class Client:
    """A paho-mqtt client on its own network thread; never reconnects by itself (a test does that).

    version: 5 (MQTT 5.0), 4 (3.1.1) or 3 (3.1). clean: clean session (3.1.1) / clean start (5.0).
    session_expiry: 5.0's Session Expiry Interval in seconds (None: 0, the session ends with the connection).
    """

    def __init__(self, broker: Broker, client_id: str | None = None, *, version: int = 5, clean: bool = True,
                 session_expiry: int | None = None, will: Will | None = None, transport: str = "tcp",
                 keepalive: int = 30, connect_properties: dict[str, Any] | None = None) -> None:
        self.broker, self.version, self.clean = broker, version, clean
        self.client_id = unique("paho") if client_id is None else client_id
        self.session_expiry, self.keepalive, self.transport = session_expiry, keepalive, transport
        self.connect_properties = dict(connect_properties or {})
        protocol = {5: paho.MQTTv5, 4: paho.MQTTv311, 3: paho.MQTTv31}[version]
        self.paho = paho.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=protocol,
                                transport="websockets" if transport == "ws" else "tcp",
                                clean_session=None if version == 5 else clean, reconnect_on_failure=False)
        if transport == "ws":
            self.paho.ws_set_options(path="/mqtt")
        if will is not None:
            self.paho.will_set(will.topic, will.payload, will.qos, will.retain,
                               paho_properties(PacketTypes.WILLMESSAGE, will.properties))
        self.messages = Collector()
        self.connack: ConnAck | None = None
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.disconnect_reason: int | None = None
        self.disconnect_properties: dict[str, Any] = {}
        self._subacks, self._pubacks = _Results(), _Results()
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = self._on_disconnect
        self.paho.on_message = self._on_message
        self.paho.on_subscribe = self._on_subscribe
        self.paho.on_unsubscribe = self._on_subscribe
        self.paho.on_publish = self._on_publish

    # callbacks, on paho's network thread
    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connack = ConnAck(reason.value, bool(flags.session_present), properties_dict(props))
        self.connected.set()

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.disconnect_reason = reason.value
        self.disconnect_properties = properties_dict(props)
        self.disconnected.set()
        self.connected.set()            # a refused or failed connect wakes connect()

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        self.messages.add(Received(msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain),
                                   properties_dict(getattr(msg, "properties", None))))

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        self._subacks.put(mid, [r.value for r in reasons] if isinstance(reasons, list) else [reasons.value])

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        self._pubacks.put(mid, reason.value)

    # the test's side
    def connect(self, timeout: float = WAIT, check: bool = True) -> ConnAck:
        """Connect and start the network thread; the CONNACK (AssertionError if refused and check)."""
        props = dict(self.connect_properties)
        if self.session_expiry is not None:
            props["session_expiry_interval"] = self.session_expiry
        kwargs: dict[str, Any] = {}
        if self.version == 5:
            kwargs = {"clean_start": self.clean, "properties": paho_properties(PacketTypes.CONNECT, props)}
        self.connected.clear()
        self.disconnected.clear()
        self.paho.connect(self.broker.host, self.broker.ws_port if self.transport == "ws" else self.broker.port,
                          self.keepalive, **kwargs)
        self.paho.loop_start()
        if not self.connected.wait(timeout) or self.connack is None:
            raise AssertionError(f"{self.client_id}: no CONNACK in {timeout}s (disconnect {self.disconnect_reason})")
        if check and self.connack.reason >= 0x80:
            raise AssertionError(f"{self.client_id}: CONNECT refused: {self.connack}")
        return self.connack

    def subscribe(self, topic: str | Iterable[str], qos: int = 1, timeout: float = WAIT,
                  options: paho.SubscribeOptions | None = None) -> list[int]:
        """Subscribe (one filter or several, all at qos, or 5.0 options); the SUBACK's reason codes."""
        filters = [topic] if isinstance(topic, str) else list(topic)
        how: Any = options if options is not None else qos
        rc, mid = self.paho.subscribe([(f, how) for f in filters])
        assert rc == paho.MQTT_ERR_SUCCESS, f"subscribe {filters}: {paho.error_string(rc)}"
        return self._subacks.wait(mid, timeout, f"SUBACK for {filters}", self.disconnected)

    def unsubscribe(self, topic: str, timeout: float = WAIT) -> Any:
        rc, mid = self.paho.unsubscribe(topic)
        assert rc == paho.MQTT_ERR_SUCCESS, f"unsubscribe {topic}: {paho.error_string(rc)}"
        return self._subacks.wait(mid, timeout, f"UNSUBACK for {topic}", self.disconnected)

    def publish(self, topic: str, payload: bytes | str = b"", qos: int = 0, retain: bool = False,
                properties: dict[str, Any] | None = None, timeout: float = WAIT) -> int:
        """Publish and wait until it is done (QoS 0 written, QoS 1 PUBACK, QoS 2 PUBCOMP); the reason code."""
        info = self.paho.publish(topic, payload, qos, retain, paho_properties(PacketTypes.PUBLISH, properties))
        assert info.rc == paho.MQTT_ERR_SUCCESS, f"publish to {topic!r}: {paho.error_string(info.rc)}"
        return self._pubacks.wait(info.mid, timeout, f"acknowledgement of the QoS {qos} publish to {topic!r}",
                                  self.disconnected)

    def disconnect(self, timeout: float = WAIT, reason: int | None = None,
                   properties: dict[str, Any] | None = None) -> None:
        """A clean DISCONNECT, then wait for the connection to close."""
        kwargs: dict[str, Any] = {}
        if self.version == 5:
            from paho.mqtt.reasoncodes import ReasonCode
            if reason is not None:
                kwargs["reasoncode"] = ReasonCode(PacketTypes.DISCONNECT, identifier=reason)
            kwargs["properties"] = paho_properties(PacketTypes.DISCONNECT, properties)
        self.paho.disconnect(**kwargs)
        self._closed(timeout)

    def kill(self, timeout: float = WAIT) -> None:
        """Drop the connection without a DISCONNECT, as a device that loses power (its will is due)."""
        sock = self.paho.socket()
        assert sock is not None, f"{self.client_id} is not connected"
        raw = getattr(sock, "_socket", sock)      # paho's WebSocket wrapper keeps the TCP socket there
        raw.shutdown(socket.SHUT_RDWR)
        self._closed(timeout)

    def _closed(self, timeout: float) -> None:
        if not self.disconnected.wait(timeout):
            raise AssertionError(f"{self.client_id}: the connection did not close in {timeout}s")
        self.paho.loop_stop()

    def close(self) -> None:
        """Teardown: disconnect if still connected, stop the network thread."""
        if self.connected.is_set() and not self.disconnected.is_set():
            try:
                self.paho.disconnect()
                self.disconnected.wait(5)
            except (OSError, ValueError):
                pass
        self.paho.loop_stop()


# ---- programs read line by line (mosquitto_sub, node scripts) ----------------------------------------------

class LineProcess:
    """A program whose stdout lines are read on a thread, to wait on them with deadlines."""

    def __init__(self, argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, match: Callable[[str], bool], timeout: float = WAIT, what: str = "a line") -> str:
        """The next line for which match() holds (lines before it are kept in seen)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{self.argv[0]}: no {what} in {timeout}s; output so far: "
                                     f"{self.seen[-20:]}\n{self.stderr()}") from None
            if line is None:
                self.lines.put(None)
                raise AssertionError(f"{self.argv[0]} exited ({self.proc.wait(10)}) before {what}; output: "
                                     f"{self.seen[-20:]}\n{self.stderr()}")
            self.seen.append(line)
            if match(line):
                return line

    def json_event(self, event: str, timeout: float = WAIT) -> dict[str, Any]:
        """The next JSON line whose "event" is event (node scripts print one object a line)."""
        line = self.expect(lambda s: s.startswith("{") and json.loads(s).get("event") in (event, "fatal"),
                           timeout, f'the "{event}" event')
        out = json.loads(line)
        if out["event"] == "fatal":
            raise AssertionError(f"{self.argv[:2]} failed: {out.get('error')}\n{self.stderr()}")
        return out

    def json_seen(self, event: str) -> list[dict[str, Any]]:
        """Every JSON line read so far whose "event" is event."""
        return [e for e in (json.loads(s) for s in self.seen if s.startswith("{")) if e.get("event") == event]

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()[-3000:]

    def finish(self, timeout: float = WAIT) -> int:
        """Wait for the exit (killing it after timeout); the exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"{self.argv[0]} still running after {timeout}s; output: {self.seen[-20:]}") \
                from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
