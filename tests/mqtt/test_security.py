"""MQTT accounts on a live node (mqtt_users_file, mqtt_allow_anonymous false): who may connect, publish and
subscribe, with the CONNACK, PUBACK and SUBACK codes each MQTT version prescribes, and the file read again
when it changes. paho-mqtt for the 5.0 side; a raw socket where the 3.1.1 code on the wire matters (paho 2
turns 3.1.1 return codes into 5.0 reason codes)."""

from __future__ import annotations

import os
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from smartgo.mqtt import codec as c
from smartgo.mqtt.auth import hash_password
from tests.support.mqtt import Broker, Client, start_smartgo, unique
from tests.support.stored import read_topic
from tests.support.waits import wait_until
from tests.support.wire import Raw

pytestmark = pytest.mark.timeout(120)

QUEUES = 8
BAD_CREDENTIALS_V3, NOT_AUTHORIZED_V3 = 4, 5          # MQTT 3.1.1 section 3.2.2.3


def users_doc(**passwords: str) -> dict:
    """alice may publish under sensors/<her name>/ and subscribe to sensors/#; bob anything."""
    users = [{"username": "alice", "password_hash": hash_password(passwords.get("alice", "wonderland"),
                                                                  iterations=1000),
              "publish": ["sensors/%u/#"], "subscribe": ["sensors/#"]}]
    for name, password in passwords.items():
        if name != "alice":
            users.append({"username": name, "password_hash": hash_password(password, iterations=1000)})
    return {"users": users}


def write_users(path: Path, doc: dict) -> None:
    """The file, with an mtime other than the last (the node reads it again when its mtime changes)."""
    before = path.stat().st_mtime if path.exists() else 0.0
    path.write_text(yaml.safe_dump(doc))
    if path.stat().st_mtime == before:
        os.utime(path, (before + 1, before + 1))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, Path]]:
    folder = tmp_path_factory.mktemp("secured")
    users = folder / "users.yaml"
    write_users(users, users_doc(bob="builder"))
    broker = start_smartgo(folder / "node", {"mqtt_users_file": str(users), "mqtt_allow_anonymous": False})
    try:
        yield broker, users
    finally:
        broker.stop()


@pytest.fixture
def clients() -> Iterator[list]:
    made: list = []
    yield made
    for client in made:
        client.close()


def paho(made: list, broker: Broker, user: str | None, password: str | None, version: int = 5) -> Client:
    client = Client(broker, version=version)
    if user is not None:
        client.paho.username_pw_set(user, password)
    made.append(client)
    return client


def raw(made: list, broker: Broker, version: int) -> Raw:
    conn = Raw(broker.port, version)
    made.append(conn)
    return conn


def registry(broker: Broker) -> str:
    return f"127.0.0.1:{broker.node.registry_port}"


@pytest.mark.parametrize("version,code", [(4, BAD_CREDENTIALS_V3), (5, c.BAD_USERNAME_OR_PASSWORD)])
def test_bad_password_or_unknown_user_refused(secured, clients, version, code):
    broker, _ = secured
    for user, password in (("alice", b"wrong"), ("nobody", b"wonderland"), ("alice", None)):
        conn = raw(clients, broker, version)
        ack = conn.connect(unique("bad"), user, password)
        assert (ack.reason, ack.session_present) == (code, False), (user, password)
        conn.until_closed()
    broker.node.logged("bad user name or password (user 'nobody')")


@pytest.mark.parametrize("version,code", [(4, NOT_AUTHORIZED_V3), (5, c.NOT_AUTHORIZED)])
def test_anonymous_refused(secured, clients, version, code):
    broker, _ = secured
    conn = raw(clients, broker, version)
    assert conn.connect(unique("anon")).reason == code
    conn.until_closed()
    refused = paho(clients, broker, None, None, version)
    assert refused.connect(check=False).reason == c.NOT_AUTHORIZED     # paho shows 3.1.1's 5 as 0x87
    broker.node.logged("anonymous access is off")


def same_queue(topic: str, template: str) -> str:
    want = zlib.crc32(topic.encode()) % QUEUES
    return next(t for t in (template.format(n) for n in range(1000)) if zlib.crc32(t.encode()) % QUEUES == want)


@pytest.mark.parametrize("version", [4, 5])
def test_publish_permission(secured, clients, tmp_path, version):
    """alice may publish under sensors/alice/ only: elsewhere 5.0 answers PUBACK 0x87, 3.1.1 acknowledges
    and drops it; either way nothing is stored (read back with the SDK after an allowed publish stored in
    the same queue, later)."""
    broker, _ = secured
    run = uuid.uuid4().hex[:10]
    alice = paho(clients, broker, "alice", "wonderland", version)
    alice.connect()
    denied = f"sensors/bob/{run}"
    allowed = same_queue(denied, f"sensors/alice/{run}/{{}}")
    assert alice.publish(denied, b"denied", qos=1) == (c.NOT_AUTHORIZED if version == 5 else 0)
    alice.publish(denied, b"denied qos 0", qos=0)
    assert alice.publish(allowed, b"allowed", qos=1) == 0
    assert not alice.disconnected.is_set()
    stored = [(m.tags, m.body) for m in read_topic(registry(broker), "MQTT", tmp_path / "offsets")
              if run in (m.tags or "")]
    assert stored == [(allowed, b"allowed")]
    broker.node.logged(f"not authorized to publish to {denied}")


@pytest.mark.parametrize("version,refused", [(4, 0x80), (5, c.NOT_AUTHORIZED)])
def test_subscribe_permission(secured, clients, version, refused):
    """alice may subscribe under sensors/ only: a SUBACK refuses the rest filter by filter, and what she
    was granted works."""
    broker, _ = secured
    run = uuid.uuid4().hex[:10]
    alice = paho(clients, broker, "alice", "wonderland", version)
    alice.connect()
    assert alice.subscribe([f"sensors/+/{run}", f"private/{run}", "#"], qos=1) == [1, refused, refused]
    bob = paho(clients, broker, "bob", "builder")
    bob.connect()
    bob.publish(f"private/{run}", b"secret", qos=1)
    bob.publish(f"sensors/x/{run}", b"reading", qos=1)
    got = alice.messages.until(b"reading")
    assert [(m.topic, m.payload) for m in got] == [(f"sensors/x/{run}", b"reading")]


def test_users_file_read_again_when_it_changes(secured, clients):
    """A user added to the file may connect, and a changed password takes effect, without a restart."""
    broker, users = secured
    conn = raw(clients, broker, 5)
    assert conn.connect(unique("carol"), "carol", b"c4r0l").reason == c.BAD_USERNAME_OR_PASSWORD
    write_users(users, users_doc(bob="builder", carol="c4r0l", alice="rabbit"))
    try:
        def carol_in() -> bool:
            conn = raw(clients, broker, 5)
            return conn.connect(unique("carol"), "carol", b"c4r0l").reason == c.SUCCESS
        wait_until(carol_in, timeout=20, interval=0.2, message="carol let in")
        assert raw(clients, broker, 5).connect(unique("alice"), "alice", b"wonderland").reason == \
            c.BAD_USERNAME_OR_PASSWORD
        assert raw(clients, broker, 5).connect(unique("alice"), "alice", b"rabbit").reason == c.SUCCESS
    finally:
        write_users(users, users_doc(bob="builder"))
