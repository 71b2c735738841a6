"""numpy, loaded on first use.

Only dispatch's columnar path (and recovery's, and the analytics) computes with numpy, but the
store modules every actor imports refer to it. Imported for real, it is 12.4 MB of RSS in each
actor process (a node has ten); loaded lazily, an actor that never dispatches never pays it.
The store modules take `np` from here and build their numpy constants on first use.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING


def _lazy(name: str) -> ModuleType | None:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:      # pragma: no cover - a core dependency
        return None
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:       # the type checker sees numpy itself (a core dependency, so never None in practice)
    import numpy as np
else:
    np = _lazy("numpy")


def load() -> None:
    """Import numpy now (the dispatch actor, and benchmarks timing steady state)."""
    if np is not None:
        np.dtype                # noqa: B018 - any attribute access runs the deferred import
