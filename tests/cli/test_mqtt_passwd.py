"""`smartgo mqtt-passwd`: the entry it prints logs its user in, with the permissions given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from smartgo.mqtt.auth import Authenticator

SMARTGO = Path(sys.executable).parent / "smartgo"


def test_the_printed_entry_logs_the_user_in_with_its_permissions(tmp_path):
    out = subprocess.run([str(SMARTGO), "mqtt-passwd", "dev42", "--publish", "devices/%u/#", "--subscribe",
                          "devices/%u/cmd"], input="s3cret\n", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "s3cret" not in out.stdout
    users = tmp_path / "users.yml"
    users.write_text(yaml.safe_dump({"users": yaml.safe_load(out.stdout)}))
    auth = Authenticator(str(users), allow_anonymous=False)
    account = auth.login("dev42", b"s3cret")
    assert account is not None and auth.login("dev42", b"wrong") is None and auth.login(None, None) is None
    assert account.may_publish("devices/dev42/telemetry") and not account.may_publish("devices/dev43/telemetry")
    assert account.may_subscribe("devices/dev42/cmd") and not account.may_subscribe("devices/+/cmd")


def test_a_bad_filter_or_empty_password_is_refused():
    bad = subprocess.run([str(SMARTGO), "mqtt-passwd", "u", "--publish", "a/#/b"], input="x\n",
                         capture_output=True, text=True, timeout=60)
    empty = subprocess.run([str(SMARTGO), "mqtt-passwd", "u"], input="\n", capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "not a topic filter: a/#/b" in bad.stderr
    assert empty.returncode != 0 and "an empty password" in empty.stderr
