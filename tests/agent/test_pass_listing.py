"""The agent's pass lists again, after acting, only the runtimes it acted on (#33, item 7): a
process start does not wait on dockerd and libvirtd a second time, and what the pass reports
still holds every runtime's instances (the others' from the listing at the pass's start).

Runtimes stand in for the real ones (no engines; tests/agent/test_failing_alone.py's), counting
their listings."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from persys.agent.agent import Agent, AgentConfig
from persys.agent.runtimes.base import ObservedWorkload, RuntimeState
from persys.model.workload import ContainerSpec, WorkloadSpec
from tests.agent.test_failing_alone import SLEEP, FaultyRuntime, _set


@dataclass
class CountingRuntime(FaultyRuntime):
    listed: int = 0

    async def list(self) -> list[ObservedWorkload]:
        self.listed += 1
        return await super().list()


def test_a_start_lists_again_only_its_own_runtime(tmp_path: Path) -> None:
    async def scenario() -> None:
        process = CountingRuntime(RuntimeError("never"), frozenset(), name="process")
        container = CountingRuntime(RuntimeError("never"), frozenset(), name="container")
        container.states["c1"] = RuntimeState.RUNNING  # desired below: nothing to do for it
        agent = Agent(AgentConfig(node_id="n1", scheduler="a", state_dir=tmp_path, orphan_grace=0.0),
                      [process, container])
        await agent.probe_runtimes()
        try:
            c1 = WorkloadSpec(type="container", container=ContainerSpec(image="busybox")).to_json().decode()
            await agent.accept_desired(_set({"c1": ("Running", c1), "p1": ("Running", SLEEP.to_json().decode())}))
            process.listed = container.listed = 0
            seen = await agent.reconcile_once()  # starts p1
            assert ("start", "p1") in process.calls
            assert (process.listed, container.listed) == (2, 1)
            assert sorted(seen) == ["c1", "p1"] and seen["c1"][0].name == "container"
            assert seen["p1"][1].state is RuntimeState.RUNNING
            seen = await agent.reconcile_once()  # nothing to do: one listing each
            assert (process.listed, container.listed) == (3, 2) and sorted(seen) == ["c1", "p1"]
        finally:
            agent.local.close()

    asyncio.run(scenario())
