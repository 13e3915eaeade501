"""Which workloads or nodes a mirror change touches (scheduler.object_changes), table-driven from
object_change_cases.yaml; and the change feed streams share: coalescing, wake-ups, resets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from persys.scheduler.views.changes import WORKLOADS, ChangeFeed, touched
from tests.cases import load

CASES: list[dict[str, Any]] = load(__file__, "object_change_cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[f"{c['watched']}-{c['kind']}-{c['id']}" for c in CASES])
def test_touched(case: dict[str, Any]) -> None:
    assert touched(case["watched"], case["kind"], case["id"]) == case["expect"]


async def test_the_feed_coalesces_wakes_and_resets() -> None:
    feed = ChangeFeed(WORKLOADS, capacity=50)
    feed.listener("workload", "ignored")  # nobody reads: nothing is kept
    assert feed.cursor == 0
    feed.readers = 2
    a = b = feed.cursor
    waiter = asyncio.create_task(feed.wait(a, None))
    await asyncio.sleep(0)
    assert not waiter.done()
    for _ in range(20):  # a churning workload is sent once, with its latest view
        feed.listener("status", "web.0")
    feed.listener("workload", "api")
    feed.listener("node", "n1")  # not a workload change
    await asyncio.wait_for(waiter, 5)
    ids, reset, a = feed.take(a)
    assert (ids, reset) == (["api", "web"], False)
    assert feed.take(a)[:2] == ([], False)  # nothing new for this stream
    feed.listener("reset", "")
    await asyncio.wait_for(feed.wait(a, None), 5)
    assert feed.take(a)[:2] == ([], True)
    for i in range(60):  # more than the log holds: a stream that slow looks at everything again
        feed.listener("workload", f"w{i}")
    assert feed.take(b)[:2] == ([], True)
    _, _, a = feed.take(a)
    await asyncio.wait_for(feed.wait(a, 0.05), 5)  # nothing pending: returns after the bound
    assert feed.take(a)[:2] == ([], False)
