"""Prometheus text exposition format 0.0.4, pure: families of samples in, bytes out.

Sans-IO like the remoting codec: metrics.py fills the families from the broker actor's tables,
metrics_http.py serves the bytes. Label values are escaped (backslash, double quote, newline),
so a topic or group name can never break the page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = dict[str, str]


def _escape_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _pairs(labels: Labels) -> str:
    return ",".join(f'{k}="{_escape_value(str(v))}"' for k, v in labels.items())


@dataclass(slots=True)
class Family:
    """One metric family: its TYPE and HELP lines and its sample lines. `const` labels go first
    on every sample (5.x's broker puts cluster, node_type and node_id on all of its metrics)."""
    name: str
    kind: str                     # counter, gauge or histogram
    help: str
    const: Labels = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    _prefix: str = ""             # the const labels, escaped once

    def __post_init__(self) -> None:
        self._prefix = _pairs(self.const)

    def _labels(self, labels: Labels) -> str:
        pairs = ",".join(filter(None, (self._prefix, _pairs(labels))))
        return "{" + pairs + "}" if pairs else ""

    def add(self, labels: Labels, value: float) -> None:
        self.lines.append(f"{self.name}{self._labels(labels)} {_number(value)}")

    def add_histogram(self, labels: Labels, bounds: list[float], counts: list[int], total: float) -> None:
        """counts[i] observations fell in (bounds[i-1], bounds[i]]; the last count is above every
        bound (+Inf). Buckets are written cumulative, as the format wants."""
        seen = 0
        for bound, n in zip([*bounds, math.inf], counts):
            seen += n
            self.lines.append(f"{self.name}_bucket{self._labels({**labels, 'le': _number(float(bound))})} {seen}")
        self.lines.append(f"{self.name}_sum{self._labels(labels)} {_number(total)}")
        self.lines.append(f"{self.name}_count{self._labels(labels)} {seen}")


def render(families: list[Family]) -> bytes:
    """The page: every family that has samples."""
    out: list[str] = []
    for family in families:
        if family.lines:
            out += [f"# HELP {family.name} {_escape_help(family.help)}", f"# TYPE {family.name} {family.kind}",
                    *family.lines]
    out.append("")
    return "\n".join(out).encode()
