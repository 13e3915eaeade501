"""The agent's shutdown is bounded: a loop that swallows its cancellation is left behind (and
logged with where it stands) instead of hanging `Agent.stop` for ever."""

from __future__ import annotations

import asyncio
import logging

import pytest

from persys.agent.agent import stop_tasks


async def test_a_loop_that_ignores_cancel_does_not_hang_the_stop(caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # the defect this guards against: cancellation taken for something else

    async def polite() -> None:
        await asyncio.sleep(3600)

    tasks = [asyncio.create_task(stubborn(), name="stubborn"), asyncio.create_task(polite(), name="polite")]
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="persys.agent.agent"):
        await asyncio.wait_for(stop_tasks(tasks, within=0.3), timeout=5)
    assert tasks[1].cancelled() and not tasks[0].done()
    assert "agent loop stubborn did not stop" in caplog.text and "stubborn" in caplog.text
    release.set()
    tasks[0].cancel()
    await asyncio.wait([tasks[0]], timeout=5)
    assert tasks[0].done()


async def test_loops_that_stop_are_awaited_and_their_failures_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    t = asyncio.create_task(broken(), name="broken")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="persys.agent.agent"):
        await stop_tasks([t], within=1)
    assert t.done() and "agent loop broken ended with RuntimeError('boom')" in caplog.text
