"""Counters of an MQTT actor: published on the board and in the metrics (`smartgo health`,
Prometheus), and written to the per-minute stats files."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class MqttStats:
    connections: int = 0
    sessions: int = 0
    subscriptions: int = 0
    retained: int = 0
    connects: int = 0
    refused: int = 0
    busy: int = 0                   # refused with "server busy": the actor holds all it may
    auth_failures: int = 0
    takeovers: int = 0
    bad_packets: int = 0
    connect_timeouts: int = 0
    keep_alive_timeouts: int = 0
    denied: int = 0
    dropped: int = 0
    expired: int = 0
    oversize: int = 0
    unrouted: int = 0
    store_failures: int = 0
    wills: int = 0
    messages_in: list[int] = field(default_factory=lambda: [0, 0, 0])      # by QoS
    messages_out: list[int] = field(default_factory=lambda: [0, 0, 0])

    def count_in(self, qos: int) -> None:
        self.messages_in[qos] += 1

    def count_out(self, qos: int) -> None:
        self.messages_out[qos] += 1

    def snapshot(self) -> dict[str, object]:
        return asdict(self)
