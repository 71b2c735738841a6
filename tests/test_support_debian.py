"""tests/support/debian.py: a missing program is installed with apt-get once, under a lock, and what
cannot be installed is a clear failure. apt-get here is a script on PATH that stands in for Debian's,
so the test neither needs the registry nor changes the machine."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from tests.support import debian

FAKE_APT = """#!/bin/sh
echo "$*" >> {calls}
sleep 0.2
case "$*" in
  *update*) exit {update_rc} ;;
  *install*) [ {install_rc} = 0 ] && printf '#!/bin/sh\\n' > {bin}/smartgo-tool && chmod +x {bin}/smartgo-tool
           exit {install_rc} ;;
esac
"""


@pytest.fixture
def apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """install(update_rc=0, install_rc=0): a stand-in apt-get first on PATH (it logs its calls and, on a
    good install, creates smartgo-tool on PATH); the calls file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    calls.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(debian, "LOCK", tmp_path / "apt.lock")
    monkeypatch.setattr(debian, "UPDATED", tmp_path / "apt.updated")

    def install(update_rc: int = 0, install_rc: int = 0) -> Path:
        script = bin_dir / "apt-get"
        script.write_text(FAKE_APT.format(calls=calls, bin=bin_dir, update_rc=update_rc, install_rc=install_rc))
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        return calls
    return install


def test_a_present_program_is_found_without_apt(apt):
    calls = apt()
    assert debian.need("sh", "dash") == debian.which("sh")
    assert calls.read_text() == ""


@pytest.mark.timeout(60)
def test_a_missing_program_is_installed_once_by_racing_workers(apt, tmp_path):
    """Four threads miss the program at once: one runs apt-get update and install, the others wait on the
    lock and find the program; a later need() runs nothing."""
    calls = apt()
    found: list[str] = []
    threads = [threading.Thread(target=lambda: found.append(debian.need("smartgo-tool", "smartgo-pkg")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert found == [str(tmp_path / "bin" / "smartgo-tool")] * 4
    assert calls.read_text().splitlines() == ["-q update", "-q install -y --no-install-recommends smartgo-pkg"]
    debian.need("smartgo-tool", "smartgo-pkg")
    assert len(calls.read_text().splitlines()) == 2


def test_update_runs_at_most_once_a_day(apt):
    calls = apt(install_rc=100)
    debian.UPDATED.write_text("recent\n")
    with pytest.raises(debian.AptError):
        debian.need("smartgo-tool", "smartgo-pkg")
    assert calls.read_text().splitlines() == ["-q install -y --no-install-recommends smartgo-pkg"]


@pytest.mark.parametrize("update_rc, install_rc", [(0, 100), (100, 0)])
def test_a_failing_apt_get_is_a_clear_error(apt, update_rc, install_rc):
    apt(update_rc=update_rc, install_rc=install_rc)
    with pytest.raises(debian.AptError, match=r"failed \(exit 100\) installing smartgo-pkg; by hand: apt-get update "
                                              r"&& apt-get install -y smartgo-pkg"):
        debian.need("smartgo-tool", "smartgo-pkg")


def test_not_root_is_a_clear_error(apt, monkeypatch):
    calls = apt()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(debian.AptError, match="this is not root"):
        debian.need("smartgo-tool", "smartgo-pkg")
    assert calls.read_text() == ""
