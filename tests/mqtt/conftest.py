"""Fixtures for the MQTT tests with real clients: the broker (a SmartGo node; Mosquitto with
SMARTGO_MQTT_TEST_BROKER=mosquitto), paho-mqtt clients, Debian's mosquitto-clients and MQTT.js.

MQTT.js is pinned by node/package-lock.json and installed with `npm ci` the first time a session
needs it (node_modules is not in git), as tests/compat does for ali-ons. Missing programs are
installed with apt-get (tests/support/debian.py); what cannot be installed fails the tests.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.debian import need
from tests.support.mqtt import Broker, Client, LineProcess, start_mqtt_broker
from tests.support.npm import npm_ci

NODE_DIR = Path(__file__).resolve().parent / "node"
#: The exact MQTT.js release under test (package.json pins it too; a mismatch reinstalls).
MQTT_JS_VERSION = "5.16.0"


@pytest.fixture(scope="session")
def mqtt_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker for the worker's MQTT tests; each test uses its own client ids and topics."""
    broker = start_mqtt_broker(tmp_path_factory.mktemp("mqtt") / "node")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def mqtt_client(mqtt_broker: Broker) -> Iterator[Callable[..., Client]]:
    """make(client_id=None, connect=True, **Client options): a paho client of the broker, connected
    unless connect=False; every one made is closed after the test."""
    made: list[Client] = []

    def make(client_id: str | None = None, connect: bool = True, **options: Any) -> Client:
        client = Client(mqtt_broker, client_id, **options)
        made.append(client)
        if connect:
            client.connect()
        return client
    yield make
    for client in made:
        client.close()


@pytest.fixture(scope="session")
def mosquitto_clients() -> dict[str, str]:
    """Paths of mosquitto_pub and mosquitto_sub (Debian's mosquitto-clients, installed if missing)."""
    return {name: need(name, "mosquitto-clients") for name in ("mosquitto_pub", "mosquitto_sub")}


@pytest.fixture(scope="session")
def mqtt_js() -> Path:
    """node/ with the pinned MQTT.js (npm `mqtt`) in its node_modules."""
    return npm_ci(NODE_DIR, "mqtt", MQTT_JS_VERSION)


@pytest.fixture
def node_script(mqtt_js: Path) -> Iterator[Callable[[str, dict[str, Any]], LineProcess]]:
    """start(script, spec): node/<script>.js running with the JSON spec, read line by line; killed after
    the test if still running."""
    started: list[LineProcess] = []

    def start(script: str, spec: dict[str, Any]) -> LineProcess:
        proc = LineProcess(["node", f"{script}.js", json.dumps(spec)], cwd=mqtt_js,
                           env={**os.environ, "NODE_NO_WARNINGS": "1"})
        started.append(proc)
        return proc
    yield start
    for proc in started:
        proc.close()
