"""A burst of concurrent applies that together fit exactly never overcommits a node."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from persys.events.memory import MemoryEventBus
from persys.model import Capabilities, Node, Phase, RuntimeInfo, parse_manifests
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.replica.assembly import Scheduler
from persys.store import open_store
from tests.waiting import until

NODES = 5
CPU_PER_NODE = 1000
WORKLOADS = 50
CPU_EACH = NODES * CPU_PER_NODE // WORKLOADS  # 100m: the burst fills the cluster exactly


def manifest(name: str) -> str:
    return f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: {name}}}
spec:
  type: process
  resources: {{cpuMillicores: {CPU_EACH}, memoryMb: 10}}
  process: {{command: [sleep, '60']}}
"""


@pytest.mark.parametrize("how", ["concurrent", "bulk"])
async def test_fifty_concurrent_applies_fit_exactly(store_url: str, how: str) -> None:
    s = Scheduler(open_store(store_url), MemoryEventBus(), SchedulerConfig(batch_size=7, commit_concurrency=16))
    await s.start()
    try:
        for i in range(NODES):
            await s.agent_api.register(Node(id=f"n{i}", capabilities=Capabilities(
                runtimes={"process": RuntimeInfo()}, cpu_millicores=CPU_PER_NODE, memory_mb=4096, disk_mb=1000)))
        manifests = [parse_manifests(manifest(f"w{i}"))[0] for i in range(WORKLOADS)]
        if how == "concurrent":
            results = await asyncio.gather(*(s.workload_api.apply(m) for m in manifests))
        else:  # two overlapping bulk applies: the second sees every workload as existing
            rev0 = await s.store.current_revision()
            results = await s.workload_api.apply_many(manifests[:30] + manifests[:1])
            assert [c for _, c, _ in results] == [True] * 30 + [False]
            assert await s.store.current_revision() - rev0 < 30  # many creates per transaction
            again = await s.workload_api.apply_many(manifests)
            assert [c for _, c, _ in again] == [False] * 30 + [True] * 20
            assert [ch for _, _, ch in again] == [False] * 30 + [True] * 20
            results = again[30:] + results[:30]
        assert all(created for _, created, _ in results)
        await until(lambda: len(s.state.placement_of) == WORKLOADS)

        per_node: dict[str, int] = defaultdict(int)
        for node_id, assignments in s.state.assignments.items():
            per_node[node_id] = sum(a.value.cpu_millicores for a in assignments.values())
        assert dict(per_node) == {f"n{i}": CPU_PER_NODE for i in range(NODES)}

        # One more fits nowhere: it stays Pending and says why.
        await s.workload_api.apply(parse_manifests(manifest("one-more"))[0])
        await until(lambda: "one-more" in s.state.statuses)
        st = s.state.statuses["one-more"].value
        assert st.phase == Phase.PENDING
        assert st.message.startswith(f"0/{NODES} nodes available: {NODES} insufficient cpu")
        assert "needs 100m" in st.message and "best node has 0m free" in st.message

        # Durable state agrees with memory: a fresh scheduler sees exactly the same placements.
        other = Scheduler(open_store(store_url), MemoryEventBus())
        await other.state.load()
        assert other.state.placement_of == s.state.placement_of
        await other.store.close()
    finally:
        await s.stop()
        await s.store.close()
