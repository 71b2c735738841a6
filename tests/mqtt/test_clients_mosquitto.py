"""Debian's mosquitto_pub and mosquitto_sub, unchanged, in MQTT 3.1.1 and 5.0 against the broker, and
talking to paho-mqtt clients through it: the README's first commands."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.mqtt import WAIT, LineProcess, unique

VERSIONS = [pytest.param("mqttv311", id="v311"), pytest.param("mqttv5", id="v5")]
#: mosquitto_sub -F: topic, QoS, retain flag, 5.0 user properties ("k:v k:v"), payload
FORMAT = "MSG %t %q %r %P|%p"


def sub(tools, broker, version: str, topic: str, count: int, qos: int = 2) -> LineProcess:
    """mosquitto_sub, -d so that its SUBACK shows (line-buffered: stdbuf); returns once subscribed. It exits
    after count messages."""
    proc = LineProcess(["stdbuf", "-oL", tools["mosquitto_sub"], "-h", broker.host, "-p", str(broker.port), "-V", version,
                        "-i", unique("msub"), "-t", topic, "-q", str(qos), "-C", str(count), "-W", str(int(WAIT)),
                        "-d", "-F", FORMAT])
    proc.expect(lambda line: "received SUBACK" in line, what="the SUBACK")
    return proc


def pub(tools, broker, version: str, topic: str, message: str, qos: int, *extra: str) -> None:
    done = subprocess.run([tools["mosquitto_pub"], "-h", broker.host, "-p", str(broker.port), "-V", version,
                           "-i", unique("mpub"), "-t", topic, "-m", message, "-q", str(qos), *extra],
                          capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, f"mosquitto_pub exited {done.returncode}: {done.stderr}"


def messages(proc: LineProcess, count: int) -> list[str]:
    """The count MSG lines (FORMAT) of a mosquitto_sub, which then exits 0."""
    lines = [proc.expect(lambda line: line.startswith("MSG "), what=f"message {i + 1} of {count}")[4:]
             for i in range(count)]
    assert proc.finish() == 0, proc.stderr()
    return lines


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_mosquitto_pub_to_mosquitto_sub(mqtt_broker, mosquitto_clients, version):
    """QoS 0, 1 and 2 from mosquitto_pub reach mosquitto_sub through a '#' filter; 5.0 user properties too."""
    root = unique("cli")
    proc = sub(mosquitto_clients, mqtt_broker, version, f"{root}/#", 3)
    try:
        for qos in (0, 1, 2):
            extra = ("-D", "publish", "user-property", "q", str(qos)) if version == "mqttv5" else ()
            pub(mosquitto_clients, mqtt_broker, version, f"{root}/q{qos}", f"hello {qos}", qos, *extra)
        got = messages(proc, 3)
    finally:
        proc.close()
    props = {0: "q:0", 1: "q:1", 2: "q:2"} if version == "mqttv5" else {0: "", 1: "", 2: ""}
    assert sorted(got) == [f"{root}/q{q} {q} 0 {props[q]}|hello {q}" for q in (0, 1, 2)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_mosquitto_tools_and_paho(mqtt_broker, mqtt_client, mosquitto_clients, version):
    """mosquitto_pub reaches a paho subscriber, and a paho publisher reaches mosquitto_sub; a retained
    message from mosquitto_pub -r reaches mosquitto_sub subscribing after it."""
    root = unique("mix")
    paho_sub = mqtt_client(version=5 if version == "mqttv5" else 4)
    paho_sub.subscribe(f"{root}/to-paho", qos=1)
    pub(mosquitto_clients, mqtt_broker, version, f"{root}/to-paho", "from mosquitto_pub", 1)
    [got] = paho_sub.messages.take(1)
    assert (got.topic, got.payload, got.qos) == (f"{root}/to-paho", b"from mosquitto_pub", 1)

    pub(mosquitto_clients, mqtt_broker, version, f"{root}/kept", "retained", 1, "-r")
    proc = sub(mosquitto_clients, mqtt_broker, version, f"{root}/+", 2, qos=1)
    try:
        mqtt_client(version=4).publish(f"{root}/from-paho", b"from paho", qos=1)
        lines = messages(proc, 2)
    finally:
        proc.close()
    assert sorted(lines) == sorted([f"{root}/kept 1 1 |retained", f"{root}/from-paho 1 0 |from paho"])
