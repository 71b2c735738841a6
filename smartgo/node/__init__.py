"""A SmartGo node: the roles (smartgo.node.roles) and the entry point that hands them to the
actor runtime's supervisor (smartgo.actors.arbiter), which imports no role itself."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """`python supervisor.py --role master|slave|registry [...]`: run one node of the role table."""
    from smartgo.actors.arbiter import main as run
    from smartgo.node.roles import ROLES
    return run(ROLES, argv)
