"""Who may connect, publish and subscribe: the MQTT users file (`mqtt_users_file`).

A YAML file of accounts with salted PBKDF2 password hashes (`smartgo mqtt-passwd` makes them)
and topic filters each may publish or subscribe to; `%u` in a filter stands for the user name.
Anonymous clients get the `anonymous` entry's permissions when `mqtt_allow_anonymous` is on.
The file is read again when it changes, so accounts change without a restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from smartgo.mqtt.topics import matches, valid_filter

log = logging.getLogger(__name__)

SCHEME = "pbkdf2_sha256"
ITERATIONS = 100_000
EVERYTHING = ("#",)


class UsersFileError(ValueError):
    pass


def hash_password(password: str, *, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return f"{SCHEME}${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def check_password(password: bytes, stored: str) -> bool:
    try:
        scheme, rounds, salt, digest = stored.split("$")
        if scheme != SCHEME:
            return False
        got = hashlib.pbkdf2_hmac("sha256", password, base64.b64decode(salt), int(rounds))
        return hmac.compare_digest(got, base64.b64decode(digest))
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    publish: tuple[str, ...] = EVERYTHING
    subscribe: tuple[str, ...] = EVERYTHING

    def may_publish(self, topic: str) -> bool:
        if self.publish == EVERYTHING:
            return not topic.startswith("$")
        return any(matches(f, topic) for f in self.publish)

    def may_subscribe(self, topic_filter: str) -> bool:
        """A filter is allowed when an allowed filter covers it level by level ('a/#' covers
        'a/+/b'; '+' covers any one level, '#' what is left)."""
        return any(_covers(f, topic_filter) for f in self.subscribe)


def _covers(allowed: str, wanted: str) -> bool:
    a, w = allowed.split("/"), wanted.split("/")
    for i, level in enumerate(a):
        if level == "#":
            return not (i == 0 and wanted.startswith("$"))
        if i >= len(w) or w[i] == "#":
            return False
        if level != "+" and level != w[i]:
            return False
        if level == "+" and i == 0 and w[i].startswith("$"):
            return False
    return len(a) == len(w)


@dataclass(frozen=True, slots=True)
class _User:
    password_hash: str
    account: Account


class Authenticator:
    """login(user, password) -> Account or None. Without a users file everyone is let in with
    every permission when anonymous access is on (the default: a node works out of the box)."""

    def __init__(self, users_file: str = "", allow_anonymous: bool = True) -> None:
        self.path = Path(users_file).expanduser() if users_file else None
        self.allow_anonymous = allow_anonymous
        self._mtime = -1.0
        self._users: dict[str, _User] = {}
        self._anonymous: Account | None = Account("anonymous") if allow_anonymous else None
        self._verified: dict[tuple[str, bytes], Account] = {}        # PBKDF2 once per credential
        if self.path is not None:
            self.reload(strict=True)

    def reload(self, strict: bool = False) -> None:
        assert self.path is not None
        try:
            mtime = self.path.stat().st_mtime
            if mtime == self._mtime:
                return
            users, anonymous = parse_users(yaml.safe_load(self.path.read_text()) or {}, self.path)
        except (OSError, yaml.YAMLError, UsersFileError) as exc:
            if strict:
                raise UsersFileError(f"mqtt_users_file {self.path}: {exc}") from None
            log.error("mqtt_users_file %s does not load (%s); the previous accounts stay", self.path, exc)
            return
        self._mtime = mtime
        self._users = users
        self._verified = {}
        self._anonymous = (anonymous or Account("anonymous")) if self.allow_anonymous else None
        log.info("mqtt users file %s: %d accounts", self.path, len(users))

    def login(self, username: str | None, password: bytes | None) -> Account | None:
        if self.path is not None:
            self.reload()
        if username is None:
            return self._anonymous
        if self.path is None:
            return self._anonymous              # no accounts: names are not checked
        key = (username, password or b"")
        account = self._verified.get(key)
        if account is not None:
            return account
        user = self._users.get(username)
        if user is None or password is None or not check_password(password, user.password_hash):
            return None
        self._verified[key] = user.account
        return user.account


def parse_users(doc: Any, where: Any) -> tuple[dict[str, _User], Account | None]:
    if not isinstance(doc, dict):
        raise UsersFileError("expected a mapping with 'users' (and optionally 'anonymous')")
    users: dict[str, _User] = {}
    for entry in doc.get("users") or []:
        if not isinstance(entry, dict) or not entry.get("username") or not entry.get("password_hash"):
            raise UsersFileError(f"a user needs username and password_hash: {entry!r}")
        name = str(entry["username"])
        users[name] = _User(str(entry["password_hash"]), _account(name, entry))
    anonymous = doc.get("anonymous")
    return users, (_account("anonymous", anonymous) if isinstance(anonymous, dict) else None)


def _account(name: str, entry: dict) -> Account:
    def filters(key: str) -> tuple[str, ...]:
        value = entry.get(key, list(EVERYTHING))
        out = tuple(str(f).replace("%u", name) for f in (value if isinstance(value, list) else [value]))
        bad = [f for f in out if not valid_filter(f)]
        if bad:
            raise UsersFileError(f"user {name}: invalid topic filter(s) in {key}: {bad}")
        return out
    return Account(name, filters("publish"), filters("subscribe"))
