"""README's "IoT devices over MQTT" block, run line by line against a node with MQTT on free ports:
the mosquitto clients get `-p PORT`, `.venv/bin/smartgo` is this venv's with the node's registry.
A line ending in `&` runs in the background, and the next line waits until the node counts the
subscription it makes (a person typing gives it that time)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from smartgo.mqtt.admin import ask_blocking, socket_path
from tests.support.mqtt import start_smartgo
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def readme_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## IoT devices over MQTT"):]
    block = section[section.index("```bash\n") + 8:]
    return [line.split("  #")[0].strip() for line in block[:block.index("```")].splitlines() if line.strip()]


def subscriptions(run_dir: Path) -> int:
    try:
        return int(ask_blocking(socket_path(run_dir, "mqtt-0"), {"op": "stats"})["stats"]["subscriptions"])
    except OSError:
        return -1


@pytest.mark.timeout(180)
def test_the_readme_mqtt_example_runs(tmp_path, mosquitto_clients):
    broker = start_smartgo(tmp_path / "node")
    try:
        env = {**os.environ, "SMARTGO_REGISTRY": f"127.0.0.1:{broker.node.registry_port}"}
        run_dir = broker.node.store / "run"
        background: list[tuple[str, subprocess.Popen]] = []
        outputs: list[str] = []
        for line in readme_block():
            line = re.sub(r"^(mosquitto_(?:sub|pub))\b", rf"\1 -p {broker.port}", line)
            line = line.replace(".venv/bin/smartgo", str(BIN / "smartgo"))
            if line.endswith("&"):
                before = subscriptions(run_dir)
                proc = subprocess.Popen(shlex.split(line[:-1]), env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
                background.append((line, proc))
                wait_until(lambda seen=before: subscriptions(run_dir) > seen, 30, 0.05, f"the subscription of {line}")
            else:
                done = subprocess.run(shlex.split(line), env=env, capture_output=True, text=True, timeout=60)
                assert done.returncode == 0, (line, done.stdout, done.stderr)
                outputs.append(done.stdout)
        for line, proc in background:
            out, _ = proc.communicate(timeout=30)
            assert proc.returncode == 0, (line, out)
            outputs.append(out)
        text = "\n".join(outputs)
        assert 'devices/42/telemetry {"temp": 21.5}' in text          # the MQTT subscriber
        assert "tags=devices/42/telemetry" in text and '{"temp": 21.5}' in text      # the RocketMQ consumer
        assert "devices/42/cmd reboot" in text                        # the RocketMQ send reached device 42
    finally:
        broker.stop()
