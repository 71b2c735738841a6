"""Repeats: a line written at every turn of a loop passes once per interval, with its count."""

from __future__ import annotations

import logging

import pytest

from smartgo.actors.logs import Repeats, gist

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


def test_a_line_carries_the_count_and_its_key_can_ignore_the_numbers():
    now = [0.0]
    r = Repeats(60.0, clock=lambda: now[0])
    text = "slave 127.0.0.1:4242 dropped: a slave reported 99, ahead of this master's {}"
    assert r.line(text.format(100), gist(text.format(100))) == text.format(100)
    assert r.line(text.format(200), gist(text.format(200))) is None     # the master's end moved: the same line
    assert r.line(text.format(300)) == text.format(300) + " (1 more like the last line held back)"  # by the text
    now[0] += 60.0
    assert r.line("refused") == "refused"
    assert r.line("other") == "other"
    assert r.line("other") is None
    now[0] += 60.0
    assert r.line("other") == "other (1 more like the last line held back)"


def test_log_writes_a_passing_line_at_its_level(caplog):
    r = Repeats(clock=lambda: 0.0)                  # once a minute by default
    logger = logging.getLogger("smartgo.test.repeats")
    with caplog.at_level(logging.INFO, logger=logger.name):
        for end in (100, 200, 300):
            r.log(logger, logging.WARNING, f"registry down at {end}", gist(f"registry down at {end}"))
    assert [(rec.levelno, rec.getMessage()) for rec in caplog.records] == [(logging.WARNING, "registry down at 100")]
