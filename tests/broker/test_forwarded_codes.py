"""The requests the net actors hand to the broker actor are exactly those its processors declare
(broker_actor.FORWARDED_CODES comes from the PROCESSORS' CODES tables): no code is declared
without being served, and every forwarded code reaches a processor on a real node."""

from __future__ import annotations

import ast

from tests.support.nodes import ROOT
from smartgo.broker.actors.broker_actor import FORWARDED_CODES, PROCESSORS, RELAYED_CODES
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand

#: Forwarded codes left out of the live round: they act on the node (cleanup) or wait for a client.
ACTING = {RequestCode.DELETE_EXPIRED_COMMITLOG, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, *RELAYED_CODES}


def classes_with_codes() -> set[str]:
    """Every class under smartgo/broker that declares a CODES table in its body."""
    found = set()
    for path in (ROOT / "smartgo" / "broker").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "CODES" for t in stmt.targets)
                    for stmt in node.body):
                found.add(node.name)
    return found


def test_every_class_with_a_codes_table_is_a_broker_actor_processor():
    """A processor left out of PROCESSORS would have its codes neither forwarded nor served: the
    net actors would answer them REQUEST_CODE_NOT_SUPPORTED."""
    assert classes_with_codes() == {cls.__name__ for cls in PROCESSORS}


def test_each_code_names_a_method_of_one_processor_only():
    owner: dict[int, str] = {}
    for cls in PROCESSORS:
        for code, name in cls.CODES.items():
            assert callable(getattr(cls, name, None)), f"{cls.__name__}.CODES[{code}] names no method {name!r}"
            assert code not in owner, f"code {code} claimed by {owner[code]} and {cls.__name__}"
            owner[code] = cls.__name__
    assert RELAYED_CODES <= FORWARDED_CODES                 # relayed: forwarded with a longer wait


def test_every_forwarded_code_reaches_a_broker_actor_processor(broker):
    """An empty request of each code gets the broker actor's own answer (often a refusal of the
    missing fields), never the net actor's 'not supported' nor the channel's 'no processor'."""
    for code in sorted(FORWARDED_CODES - ACTING):
        r = broker.call(RemotingCommand(code))
        assert r.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED, (code, r.remark)
        assert "no processor" not in (r.remark or ""), (code, r.remark)
