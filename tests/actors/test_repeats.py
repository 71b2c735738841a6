"""Repeats: a line written at every turn of a loop passes once per interval, with its count."""

from __future__ import annotations

import pytest

from smartgo.actors.logs import Repeats

pytestmark = pytest.mark.timeout(10)


def test_the_same_line_passes_once_per_interval_with_the_count_held_back():
    now = [100.0]
    r = Repeats(60.0, clock=lambda: now[0])
    assert r.check("refused") == 0                 # the first passes
    assert [r.check("refused") for _ in range(3)] == [None, None, None]
    assert r.check("another") == 3                 # a new text passes at once
    now[0] += 59.0
    assert r.check("another") is None
    now[0] += 1.0
    assert r.check("another") == 1                 # a minute on, with what was held back
