"""Health answers from memory in every mode (issue #31: ~7 s on a replica cut off from etcd).
The store is made to hang (fault injection: a store call that never answers, as a cut-off
etcd client's does); health still answers at once, and says the store is down once the
background probe's bound has passed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from persys.events.memory import MemoryEventBus
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.replica import dependency_probe
from persys.scheduler.replica.assembly import Scheduler
from persys.store import open_store


@pytest.fixture
async def sched(tmp_path: Path) -> AsyncIterator[Scheduler]:
    s = Scheduler(open_store(f"sqlite:///{tmp_path / 'state.db'}"), MemoryEventBus(),
                  SchedulerConfig(health_interval_seconds=0.1))
    await s.start()
    yield s
    await s.stop()
    await s.store.close()


async def test_health_answers_from_memory_while_the_store_hangs(sched: Scheduler,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    s = sched
    assert (await s.health())["storeOk"]
    monkeypatch.setattr(dependency_probe, "PROBE_TIMEOUT", 0.5)
    hung = asyncio.Event()

    async def hangs() -> dict[str, Any]:
        hung.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    monkeypatch.setattr(s.store, "status", hangs)
    await asyncio.wait_for(hung.wait(), 5)  # the background probe is now stuck on the store
    started = time.monotonic()
    h = await s.health()
    assert time.monotonic() - started < 0.2, "health waited on the store"
    deadline = time.monotonic() + 5
    while (h := await s.health())["storeOk"]:
        assert time.monotonic() < deadline, "the hanging store never showed in health"
        await asyncio.sleep(0.05)
    assert "did not answer within" in h["detail"]
    store = next(d for d in h["dependencies"] if d["name"] == "store")
    assert store["ok"] is False
