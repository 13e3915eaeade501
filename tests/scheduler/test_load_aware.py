"""Load-aware scoring through a replica: heartbeats' usage, their p95 taken into the snapshot,
the quieter of two equal nodes chosen, with observed_load in the explanation; off by default."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persys.events.memory import MemoryEventBus
from persys.model import NodeUsage, parse_manifests
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.mirror.load_window import UsageWindow
from persys.scheduler.replica.assembly import Scheduler
from persys.store import open_store
from tests.scheduler.test_core import Clock, manifest, node
from tests.scheduler.test_node_ops import until


def test_usage_window_p95() -> None:
    w = UsageWindow()
    assert w.p95() is None
    for i in range(100):
        w.add(float(i), i * 10)
    assert w.p95() == (97.0, 970)  # the last 60 samples (40..99): the 57th of them
    w2 = UsageWindow()
    w2.add(12.5, 300)
    assert w2.p95() == (12.5, 300)


@pytest.fixture
async def loaded(tmp_path: Path) -> AsyncIterator[Scheduler]:
    sched = Scheduler(open_store(f"sqlite:///{tmp_path / 'state.db'}"), MemoryEventBus(),
                      SchedulerConfig(node_grace_seconds=10, monitor_interval_seconds=0.02, load_aware_weight=5,
                                      load_refresh_seconds=0), clock=Clock())
    await sched.start()
    yield sched
    await sched.stop()
    await sched.store.close()


async def test_the_quieter_node_is_chosen(loaded: Scheduler) -> None:
    s = loaded
    await s.agent_api.register(node("busy"))
    await s.agent_api.register(node("calm"))
    for _ in range(5):
        s.agent_api.heartbeat("busy", NodeUsage(cpu_percent=92.0, memory_used_mb=1900))
        s.agent_api.heartbeat("calm", NodeUsage(cpu_percent=3.0, memory_used_mb=100))
    await until(lambda: s.placement.snapshot().node("busy").observed_cpu_percent == 92.0)  # type: ignore[union-attr]
    await s.workload_api.apply(parse_manifests(manifest("web"))[0])
    await until(lambda: s.state.placement_of.get("web") == "calm")
    explanation = s.workload_view("web")["placement"]["explanation"]
    assert "observed_load" in explanation, explanation
