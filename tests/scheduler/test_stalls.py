"""The event-loop stall watchdog (persys.scheduler.replica.stalls)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from persys.scheduler.replica.stalls import StallWatchdog


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a long computation or a blocking call does to every other task


async def test_a_stall_is_logged_with_its_length_and_what_held_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    dog = StallWatchdog(0.05)
    dog.start()
    try:
        await asyncio.sleep(0.05)
        with caplog.at_level(logging.WARNING, logger="persys.scheduler.replica.stalls"):
            hold_the_loop(0.3)
            await asyncio.sleep(0.05)  # the loop runs again: the stall is reported
    finally:
        await dog.stop()
    reports = [r.getMessage() for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert dog.stalls >= 1 and dog.longest >= 0.3
    assert any("hold_the_loop" in text for text in reports), reports


def test_the_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError):
        StallWatchdog(0)
