"""The package's layers, read from every module's imports with `ast` (function-level and
TYPE_CHECKING imports included), so an upward import fails here rather than in a reviewer's head.

Bottom to top; a package may import only from the packages listed for it (ALLOWED), or must not
import the ones listed (FORBIDDEN):

  package          may import (of SmartGo)                        why
  smartgo.filter   nothing                                        SQL92 and tag filters: pure functions
  smartgo.net      accel                                          the remoting codec, its C accelerator
  smartgo.store    accel                                          the store, its C accelerator (Java hash)
  smartgo.common   accel, cpus, config, net, store, filter        what clients, registry and broker share:
                                                                  request bodies, persisted files,
                                                                  properties, heartbeats, ACL signing
                                                                  and checking
  smartgo.actors   anything but a role: no broker, registry,      the actor runtime; roles are handed
                   client, node, cli                              to it (smartgo.node.roles)
  smartgo.client   anything but broker, registry, actors, node,   the client SDK
                   cli
  smartgo.registry anything but broker, client, actors, node,     the name server
                   cli
  smartgo.mqtt     anything but broker, registry, node, cli       the MQTT front door: codec, engine,
                                                                  its actor (a client of the cluster)
  smartgo.broker   all of the above                               the broker role
  smartgo.node     all of the above                               the role table, the registry actor

The small top-level modules: cpus and stats_schema import nothing of SmartGo; accel loads
the C accelerators of net and store (and reports which are in use); config reads cpus and
net.tls for its settings. A module outside every row fails too: each new package takes its row.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "smartgo"

_BASICS = {"smartgo.accel", "smartgo.cpus", "smartgo.config"}
ALLOWED: dict[str, set[str]] = {
    "smartgo.cpus": set(),
    "smartgo.stats_schema": set(),
    "smartgo.accel": {"smartgo.net", "smartgo.store"},
    "smartgo.config": {"smartgo.cpus", "smartgo.net"},
    "smartgo.filter": set(),
    "smartgo.net": {"smartgo.accel"},
    "smartgo.store": {"smartgo.accel"},
    "smartgo.common": _BASICS | {"smartgo.net", "smartgo.store", "smartgo.filter"},
}
_ROLES = {"smartgo.broker", "smartgo.registry", "smartgo.client", "smartgo.node", "smartgo.cli"}
FORBIDDEN: dict[str, set[str]] = {
    "smartgo.actors": _ROLES,
    "smartgo.client": _ROLES - {"smartgo.client"} | {"smartgo.actors"},
    "smartgo.registry": _ROLES - {"smartgo.registry"} | {"smartgo.actors"},
    "smartgo.mqtt": _ROLES - {"smartgo.client"},
}
TOP = {"smartgo.broker", "smartgo.node", "smartgo.cli"}     # may import every layer below


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    name = module_name(path)
    return imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")


def imports_of(text: str, name: str, is_package: bool = False) -> set[str]:
    """Every smartgo module the text of module `name` imports, anywhere in it, as absolute names."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(text, name)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            # `from smartgo import accel` imports the module smartgo.accel
            found.update(f"{base}.{alias.name}" for alias in node.names)
            found.add(base)
    return {m for m in found if m == "smartgo" or m.startswith("smartgo.")}


def _within(module: str, packages: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _layer(module: str) -> str:
    return ".".join(module.split(".")[:2])


def violations() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        layer = _layer(source)
        if layer != "smartgo" and layer not in ALLOWED.keys() | FORBIDDEN.keys() | TOP:
            found.append(f"{source}: not in the layer table")
        reported: list[str] = []
        for target in sorted(imports(path)):
            if target == "smartgo" or _layer(target) == layer or any(target.startswith(r + ".") for r in reported):
                continue                    # a name from a module already reported
            if (layer in ALLOWED and not _within(target, ALLOWED[layer])
                    or layer in FORBIDDEN and _within(target, FORBIDDEN[layer])):
                reported.append(target)
                found.append(f"{source} -> {target}")
    return found


def test_no_module_imports_above_its_layer():
    found = violations()
    assert not found, f"{len(found)} upward imports:\n" + "\n".join(found)


def test_the_walk_sees_function_level_and_relative_imports():
    """The checker itself: imports inside a function, relative ones and `from smartgo import x`."""
    text = "def f():\n    from ..broker import topics\n    from smartgo import accel\n"
    assert {"smartgo.broker.topics", "smartgo.accel"} <= imports_of(text, "smartgo.net.codes")
    assert "smartgo.broker.topics" in imports_of("from ..broker import topics\n", "smartgo.net", is_package=True) \
        or "smartgo.broker.topics" in imports_of("from .broker import topics\n", "smartgo.net", is_package=True)


def test_importing_the_client_loads_no_server_module():
    """What an application using the SDK loads: the client and the layers below it, no role."""
    code = ("import smartgo.client, sys; print(sorted(m for m in sys.modules if m.split('.')[:2] in "
            "(['smartgo', 'broker'], ['smartgo', 'registry'], ['smartgo', 'actors'], ['smartgo', 'node'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
