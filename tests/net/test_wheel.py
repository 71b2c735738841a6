"""The timing wheel behind MQTT keep-alives and remoting idle timeouts: each entry is handed out
once, at the first tick at or after its deadline, whatever the slot width."""

from __future__ import annotations

import pytest

from smartgo.net.wheel import TimingWheel


@pytest.mark.timeout(10)
def test_entries_come_due_once_at_their_slot() -> None:
    wheel: TimingWheel[str] = TimingWheel()
    wheel.add(10.2, "a")
    wheel.add(11.0, "b")
    wheel.add(13.5, "c")
    assert len(wheel) == 3
    assert wheel.due(10.9) == []            # a's slot is second 11
    assert sorted(wheel.due(11.0)) == ["a", "b"]
    assert wheel.due(11.5) == []
    assert wheel.due(20.0) == ["c"]
    assert len(wheel) == 0


@pytest.mark.timeout(10)
def test_a_narrow_wheel_hands_out_within_its_width() -> None:
    wheel: TimingWheel[int] = TimingWheel(0.1)
    wheel.add(0.31, 1)
    wheel.add(0.45, 2)
    assert wheel.due(0.35) == []
    assert wheel.due(0.40) == [1]
    assert wheel.due(0.50) == [2]


@pytest.mark.timeout(10)
def test_an_entry_added_for_the_past_comes_at_the_next_tick() -> None:
    wheel: TimingWheel[str] = TimingWheel()
    wheel.add(5.0, "first")
    assert wheel.due(7.0) == ["first"]
    wheel.add(3.0, "late")                  # a slot already handed out
    assert wheel.due(7.5) == []
    assert wheel.due(8.0) == ["late"]


@pytest.mark.timeout(10)
def test_a_long_gap_visits_only_the_slots_that_exist() -> None:
    wheel: TimingWheel[int] = TimingWheel()
    for n in range(5):
        wheel.add(1_000.0 * (n + 1), n)
    assert wheel.due(10_000_000.0) == [0, 1, 2, 3, 4]
