"""The descriptor budget of a connection-holding actor (net or MQTT): each process may open only
so many files (20,000 on the reference machine, a hard limit), so a node holds more connections
by running more such actors, each refusing what is past its share rather than failing on EMFILE."""

from __future__ import annotations

import resource

#: Descriptors an actor keeps for itself (its rings, store files, peer and admin sockets, logs): a
#: twentieth of its open-files limit, at least this.
FD_RESERVE = 256


def open_files_limit(current: bool = False) -> int:
    """The open-files limit the actors run with: the supervisor raises the soft limit to the hard one
    before it starts them (smartgo.actors.arbiter.raise_open_files_limit); current: this process's."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0 if current else 1]
    return 1 << 20 if limit == resource.RLIM_INFINITY else limit


def connections_per_actor(open_files: int) -> int:
    """Connections one actor takes before it refuses more."""
    return max(1, open_files - max(FD_RESERVE, open_files // 20))


def actors_for(connections: int) -> int:
    """Actors needed to hold `connections` under the open-files limit (0 for none asked)."""
    return -(-connections // connections_per_actor(open_files_limit()))


def worth_logging(count: int) -> bool:
    """Log the 1st, 10th, 100th, 1,000th and every 10,000th of a repeated refusal, not each one."""
    return count in (1, 10, 100, 1000) or count % 10000 == 0
