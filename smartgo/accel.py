"""The optional C accelerators, and the switch that turns them off.

Each one (smartgo/net/_codec.c, smartgo/store/_java_hash.c) does what the Python code beside it
does, faster, and the tests hold them to the same results. `pip install` builds them where a C
compiler and the Python headers are; an install without them runs the Python code.
SMARTGO_PURE_PYTHON=1 in the environment makes a process (and the actors and load generators it
starts, which inherit it) use the Python code even where they are built: for A/B runs.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

#: False under SMARTGO_PURE_PYTHON (anything but "" or "0").
ENABLED = os.environ.get("SMARTGO_PURE_PYTHON", "") in ("", "0")


def load(name: str) -> ModuleType | None:
    """The built accelerator module `name`, or None when it was not built."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def in_use() -> dict[str, bool]:
    """Which accelerators this process runs (the benchmarks report it)."""
    from smartgo.net import frame
    from smartgo.store import java_hash
    return {"codec": frame.codec_in_use() == "c", "java_hash": java_hash.accelerated()}
