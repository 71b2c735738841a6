"""The broker actor's view of its node's MQTT actors (smartgo.mqtt): MQTT_ADMIN (40001, SmartGo's
own request: `smartgo admin mqtt-clients | mqtt-sessions | mqtt-subscriptions | mqtt-kick`), and
the MQTT counters of the metrics, `smartgo health` and the stats files.

Sessions live in the MQTT actors' memory, so the broker actor asks each of them over its admin
channel (smartgo/mqtt/admin.py, a UNIX socket in the run dir) and merges the answers. It polls
their counters once a second: `totals` only grow while the broker actor runs (an MQTT actor that
restarts from zero adds its new counts), as Prometheus counters must, and the stats record of a
window gets what was counted between the polls that fell in it.

Request body (JSON): {"op": "clients" | "sessions" | "subscriptions" | "kick" | "stats",
"limit": N, "client": "<client id prefix; the client id for kick>", "filter": "<filter prefix>"}.
Answer body: {"actors": [names asked], "errors": {actor: why}, "total": N, "items": [...]} (sorted by
client id, cut at limit), {"kicked": bool} for kick, {"stats": summed counters} for stats.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from smartgo.broker.channel import ClientRef
from smartgo.mqtt.admin import AdminError, ask, merge_stats, request_limit, socket_path
from smartgo.mqtt.listeners import mqtt_names, mqtt_ports
from smartgo.mqtt.stats import MqttStats
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand

if TYPE_CHECKING:
    from smartgo.broker.actors.broker_actor import BrokerActor

ASK_TIMEOUT = 2.0          # s each MQTT actor has; under the net actor's wait for a forwarded answer (3 s)
LISTS = ("clients", "sessions", "subscriptions")
#: The gauges of MqttStats; the rest are counters, which the stats records count per window.
GAUGES = frozenset({"connections", "sessions", "subscriptions", "retained"})


def _grown(now: Any, before: Any) -> Any:
    """What a counter added since the last poll; all of it when the actor restarted from zero."""
    if isinstance(now, list):
        return [_grown(a, b) for a, b in zip(now, before or [0] * len(now))]
    before = before or 0
    return now - before if now >= before else now


class MqttProcessor:
    CODES = {RequestCode.MQTT_ADMIN: "mqtt_admin"}

    def __init__(self, broker: BrokerActor) -> None:
        self.b = broker
        cfg = broker.config
        self.actors = mqtt_names(cfg) if mqtt_ports(cfg) else []     # a slave's too (smartgo/node/roles.py)
        self.paths = {name: socket_path(cfg.run_path, name) for name in self.actors}
        self.last: dict[str, dict[str, Any]] = {}        # actor -> its latest counters
        self.totals: dict[str, Any] = {}                 # counters since the broker actor started
        self.window: dict[str, Any] = {}                 # counters since the last stats record

    # ---- asking the MQTT actors ------------------------------------------------------------------------
    async def _ask_all(self, request: dict) -> tuple[dict[str, dict], dict[str, str], list[str]]:
        """The answers by actor, the actors that did not answer (why), and the refusals of the request."""
        answers = await asyncio.gather(*(ask(self.paths[n], request, ASK_TIMEOUT) for n in self.actors),
                                       return_exceptions=True)
        done: dict[str, dict] = {}
        silent: dict[str, str] = {}
        refused: list[str] = []
        for name, got in zip(self.actors, answers):
            if isinstance(got, AdminError):
                refused.append(str(got).partition(": ")[2])
            elif isinstance(got, (OSError, ValueError)):
                silent[name] = str(got) or type(got).__name__
            elif isinstance(got, BaseException):
                raise got
            else:
                done[name] = got
        return done, silent, refused

    async def mqtt_admin(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        try:
            asked = json.loads(request.body_bytes() or b"{}")
            if not isinstance(asked, dict) or asked.get("op") not in (*LISTS, "kick", "stats"):
                raise ValueError(f"op must be one of {', '.join((*LISTS, 'kick', 'stats'))}")
            limit = request_limit(asked)
        except ValueError as exc:            # AdminError too
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"MQTT_ADMIN: {exc}")
        op = asked["op"]
        if op == "kick":
            self.b.log.info("%s asks to disconnect MQTT client %r", client.addr, asked.get("client"))
        answers, errors, refused = await self._ask_all(asked)
        if refused:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"MQTT_ADMIN: {refused[0]}")
        out: dict[str, Any] = {"actors": self.actors, "errors": errors}
        if op == "kick":
            out["kicked"] = any(a["kicked"] for a in answers.values())
        elif op == "stats":
            out["stats"] = merge_stats(a["stats"] for a in answers.values())
        else:
            items = sorted((i for a in answers.values() for i in a["items"]),
                           key=lambda i: (i["client_id"], i.get("filter", "")))
            out["total"] = sum(a["total"] for a in answers.values())
            out["items"] = items[:limit]
        return request.make_response(ResponseCode.SUCCESS, body=json.dumps(out, separators=(",", ":")).encode())

    async def poll(self) -> None:
        """Once a second: every MQTT actor's counters (one that does not answer keeps its last ones)."""
        if not self.actors:
            return
        answers, _, _ = await self._ask_all({"op": "stats"})
        for name, answer in answers.items():
            now = answer["stats"]
            before = self.last.get(name, {})
            grown = {k: _grown(v, before.get(k)) for k, v in now.items() if k not in GAUGES}
            self.totals = merge_stats([self.totals, grown])
            self.window = merge_stats([self.window, grown])
            self.last[name] = now

    # ---- what the others show --------------------------------------------------------------------------
    def gauges(self) -> dict[str, int]:
        return {k: sum(s.get(k, 0) for s in self.last.values()) for k in sorted(GAUGES)}

    def summary(self) -> dict[str, Any] | None:
        """Health's MQTT line: the gauges now and the counters since the broker actor started."""
        if not self.actors:
            return None
        return {"actors": self.actors, "answering": sorted(self.last), **self.gauges(), **self.totals}

    def take_window(self) -> dict[str, Any] | None:
        """The stats record's "mqtt" object (docs/STATS.md): gauges now, counts since the last record."""
        if not self.actors:
            return None
        window, self.window = self.window, {}
        counts = {k: window.get(k, v) for k, v in MqttStats().snapshot().items() if k not in GAUGES}
        return {**self.gauges(), **counts}
