"""Debian packages a test needs, installed with apt-get the first time a session misses one.

CI runs on a fresh Debian machine as root with Debian's registry reachable, and .ci/run only
installs the Python side: a fixture that needs a program (mosquitto, mosquitto_sub, node) calls
need() and gets its path. Under pytest-xdist several workers may miss the same package at once, so
the install runs under an exclusive lock file, and `apt-get update` runs at most once a day of the
machine (a stamp file beside the lock). Not root, or apt-get failing, is an AptError naming the
package and the command to run by hand: a test that silently skips proves nothing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

#: Where programs are looked for: PATH, then the system folders a non-login shell may lack (mosquitto is
#: in /usr/sbin).
EXTRA_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
LOCK = Path(tempfile.gettempdir()) / "smartgo-apt.lock"
UPDATED = Path(tempfile.gettempdir()) / "smartgo-apt.updated"
UPDATE_EVERY = 24 * 3600
APT_TIMEOUT = 600


class AptError(AssertionError):
    """A package a test needs is missing and could not be installed."""


def which(binary: str) -> str | None:
    """The path of binary on PATH or in the system folders, None when it is nowhere."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *EXTRA_PATH])
    return shutil.which(binary, path=path)


def need(binary: str, package: str) -> str:
    """The path of binary, installing the Debian package that ships it first if it is missing."""
    if found := which(binary):
        return found
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # xdist workers: one installs, the others wait and find it
        if found := which(binary):
            return found
        _install(package)
    if found := which(binary):
        return found
    raise AptError(f"apt-get installed {package}, but {binary} is still not on PATH or in {EXTRA_PATH}")


def _install(package: str) -> None:
    by_hand = f"apt-get update && apt-get install -y {package}"
    if os.geteuid() != 0:
        raise AptError(f"the tests need Debian's {package} and this is not root, so it cannot be installed "
                       f"here; install it: {by_hand}")
    if not _updated_recently():
        _apt(["update"], package, by_hand)
        UPDATED.write_text(f"{time.time()}\n")
    _apt(["install", "-y", "--no-install-recommends", package], package, by_hand)


def _updated_recently() -> bool:
    try:
        return time.time() - UPDATED.stat().st_mtime < UPDATE_EVERY
    except OSError:
        return False


def _apt(args: list[str], package: str, by_hand: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run(["apt-get", "-q", *args], capture_output=True, text=True, timeout=APT_TIMEOUT, env=env,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise AptError(f"the tests need Debian's {package}, and there is no apt-get to install it; "
                       f"install it by hand") from None
    except subprocess.TimeoutExpired:
        raise AptError(f"`apt-get {' '.join(args)}` took over {APT_TIMEOUT}s installing {package}: is Debian's "
                       f"registry reachable? By hand: {by_hand}") from None
    if done.returncode != 0:
        raise AptError(f"`apt-get {' '.join(args)}` failed (exit {done.returncode}) installing {package}; "
                       f"by hand: {by_hand}\n{done.stderr[-3000:]}")
