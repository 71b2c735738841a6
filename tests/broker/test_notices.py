"""NOTIFY_CONSUMER_IDS_CHANGED coalesced per group: a change is told at once unless the group was
told within its window (which grows with the group); then once when the window ends, for every
change in it. 1,000 consumers joining one group cost a few notices each, not a thousand."""

from __future__ import annotations

import asyncio

import pytest

from smartgo.broker.managers.notices import ConsumerNotices


@pytest.mark.timeout(20)
def test_changes_within_a_window_are_told_once_when_it_ends() -> None:
    async def main() -> None:
        told: list[tuple[str, float]] = []
        loop = asyncio.get_running_loop()
        notices = ConsumerNotices(lambda g: told.append((g, loop.time())), per_member=0.002, longest=5.0)
        start = loop.time()
        notices.changed("G", 100)                     # window 0.2 s
        assert [g for g, _ in told] == ["G"]          # the first change: at once
        for members in range(101, 111):
            notices.changed("G", members)             # ten more within the window: one notice later
        notices.changed("small", 1)                   # another group has its own window
        assert [g for g, _ in told] == ["G", "small"]
        await asyncio.sleep(0.5)
        assert [g for g, _ in told] == ["G", "small", "G"]
        assert 0.15 <= told[2][1] - start <= 0.45
        await asyncio.sleep(0.25)                      # past the window: told at once again
        notices.changed("G", 110)
        assert [g for g, _ in told] == ["G", "small", "G", "G"]
    asyncio.run(main())


@pytest.mark.timeout(20)
def test_a_thousand_joins_cost_a_few_notices_not_a_thousand() -> None:
    async def main() -> None:
        told: list[str] = []
        notices = ConsumerNotices(told.append, per_member=0.005, longest=0.3)
        for members in range(1, 1001):                # a restart: every consumer back within ~0.1 s
            notices.changed("G", members)
            if members % 100 == 0:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.4)
        assert 2 <= len(told) <= 6, told              # RocketMQ's rule: 1,000 (each told all the members)
    asyncio.run(main())
