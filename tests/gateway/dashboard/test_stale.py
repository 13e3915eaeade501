"""The overview's copies of slow scheduler answers (stale.py): fresh copies used as they are, an
old one shown when the new answer is slower than the budget (and replaced once it lands), no
copy at all waited for, errors never hidden when there is nothing to show instead."""

from __future__ import annotations

import asyncio

import pytest

from persys.gateway.dashboard.stale import Stale


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_fresh_old_and_slow_answers() -> None:
    async def run() -> None:
        clock = Clock()
        cache: Stale[int] = Stale(max_age=1.0, budget=0.05, keep=60.0, clock=clock)
        asked: list[int] = []
        gate = asyncio.Event()

        async def quick() -> int:
            asked.append(1)
            return len(asked)

        async def slow() -> int:
            asked.append(2)
            await gate.wait()
            return 99

        assert (await cache.get(quick)).value == 1  # nothing yet: asked and waited for
        clock.now += 0.5
        assert (await cache.get(quick)).value == 1 and asked == [1]  # fresh: not asked again
        clock.now += 1.0
        old = await cache.get(slow)  # too old, and the new answer is slower than the budget
        assert old.value == 1 and old.age(clock()) == 1.5 and asked == [1, 2]
        assert (await cache.get(slow)).value == 1 and asked == [1, 2]  # the same question is not asked twice
        gate.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert (await cache.get(quick)).value == 99  # it landed: the next page has it
        clock.now += 120  # past `keep`: too old to show, so the page waits for the answer
        assert (await cache.get(quick)).value == 3

    asyncio.run(run())


def test_an_error_with_nothing_to_show_is_the_pages() -> None:
    async def run() -> None:
        cache: Stale[int] = Stale()

        async def broken() -> int:
            raise RuntimeError("scheduler unavailable")

        with pytest.raises(RuntimeError, match="unavailable"):
            await cache.get(broken)

    asyncio.run(run())
