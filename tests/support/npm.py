"""npm packages a test suite drives (MQTT.js, ali-ons), pinned by a package-lock.json in the suite's node/
folder and installed there with `npm ci` the first time a session needs them (node_modules is not in git).
Node.js and npm come from Debian's packages when missing (tests/support/debian.py)."""

from __future__ import annotations

import fcntl
import json
import subprocess
from pathlib import Path

from tests.support.debian import need

NPM_CI_TIMEOUT = 300


class NpmError(AssertionError):
    """The pinned package could not be installed."""


def installed_version(folder: Path, package: str) -> str | None:
    try:
        return json.loads((folder / "node_modules" / package / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def npm_ci(folder: Path, package: str, version: str) -> Path:
    """folder, with package at version in its node_modules: `npm ci` when it is missing or another
    version, under a lock file (pytest-xdist workers: one installs, the others wait for it)."""
    need("node", "nodejs")
    npm = need("npm", "npm")
    with open(folder / "node_modules.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed_version(folder, package) == version:
            return folder
        try:
            done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=folder,
                                  capture_output=True, text=True, timeout=NPM_CI_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise NpmError(f"`npm ci` in {folder} took over {NPM_CI_TIMEOUT}s: is the npm registry reachable?") \
                from None
        if done.returncode != 0 or installed_version(folder, package) != version:
            raise NpmError(f"`npm ci` in {folder} could not install {package} {version} (exit {done.returncode}); "
                           f"is the npm registry reachable?\n{done.stderr[-3000:]}")
    return folder
