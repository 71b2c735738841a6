"""ClientConfig: what every producer, consumer and admin client shares (Java's ClientConfig), with
RocketMQ's defaults. Intervals are seconds; tests shorten them, production keeps the defaults."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

from smartgo.client.uniq_id import local_ip

_instances = itertools.count(1)


def split_registry(registry: str | list[str] | tuple[str, ...]) -> list[str]:
    """"host:port;host:port" (also commas) or a list -> the address list."""
    if isinstance(registry, str):
        parts = registry.replace(",", ";").split(";")
    else:
        parts = list(registry)
    addrs = [p.strip() for p in parts if p and p.strip()]
    if not addrs:
        raise ValueError("no registry address given (expected 'host:port;host:port')")
    for addr in addrs:
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"registry address {addr!r} is not host:port")
    return addrs


@dataclass(slots=True)
class ClientConfig:
    registry: list[str]
    #: clientID is "<client_ip>@<pid>", plus "#<instance_name>" when several clients share a
    #: process (each client object gets its own instance and connections).
    instance_name: str | None = None
    client_ip: str = field(default_factory=local_ip)
    #: Request timeout for control calls (route, heartbeat, offsets, admin).
    timeout: float = 3.0
    poll_registry_interval: float = 30.0
    heartbeat_interval: float = 30.0
    persist_offset_interval: float = 5.0
    #: Header type towards SmartGo peers; foreign peers always get JSON (negotiated per connection).
    use_msgpack: bool = True
    #: Keep polling this long after a request or a read before the loop sleeps (smartgo.net.busy_poll):
    #: lower latency and, on VMs, less CPU per synchronous call; 0 (default) never spins.
    busy_poll_us: int = 0
    client_id: str = ""
    #: ACL credentials (RocketMQ's SessionCredentials): when access_key is set, every request is
    #: signed as AclClientRPCHook signs it, for brokers with ACL enabled.
    access_key: str = ""
    #: TLS towards brokers and registries (Java's useTLS); the server's certificate is checked only
    #: against tls_ca_file when one is given (Java's clients trust any by default).
    use_tls: bool = False
    tls_ca_file: str = ""
    #: This client's certificate and key, for brokers that ask for one (tls_need_client_auth).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    secret_key: str = ""
    security_token: str = ""

    def __post_init__(self) -> None:
        if not self.client_id:
            n = next(_instances)
            suffix = self.instance_name if self.instance_name else (str(n) if n > 1 else "")
            self.client_id = f"{self.client_ip}@{os.getpid()}" + (f"#{suffix}" if suffix else "")

    @classmethod
    def make(cls, registry: str | list[str], **options: object) -> ClientConfig:
        return cls(split_registry(registry), **options)  # type: ignore[arg-type]  # fields by name
