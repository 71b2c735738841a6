"""cProfile for the hot actors, switched on by the benchmark (`bench_broker.py --profile DIR`).

The benchmark sets SMARTGO_PROFILE_DIR before it starts the node; the actors that call
`start(name)` profile their whole life and write DIR/<name>-<pid>.prof when they stop.
"""

from __future__ import annotations

import cProfile
import os
from pathlib import Path

ENV = "SMARTGO_PROFILE_DIR"


def start(name: str) -> cProfile.Profile | None:
    if not os.environ.get(ENV):
        return None
    profile = cProfile.Profile()
    profile.enable()
    return profile


def dump(profile: cProfile.Profile | None, name: str) -> None:
    if profile is None:
        return
    profile.disable()
    out = Path(os.environ[ENV])
    out.mkdir(parents=True, exist_ok=True)
    profile.dump_stats(out / f"{name}-{os.getpid()}.prof")
