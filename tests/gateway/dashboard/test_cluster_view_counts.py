"""The live view's workload counts by phase, kept as changes arrive (the overview does not walk
50,000 workloads per page): always equal to counting them afresh. The scheduler's Watch stream
is stood in for by a list of ObjectChange messages (the real stream is covered by the browser
tests); what is tested is the view's bookkeeping."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from persys._pb.persys.v1 import watch_pb2
from persys.gateway.dashboard.cluster_view import ClusterView
from persys.gateway.dashboard.figures import overview, phase_counts


def change(kind: str, wid: str, phase: str = "") -> watch_pb2.ObjectChange:
    doc = json.dumps({"id": wid, "phase": phase}).encode() if phase else b""
    return watch_pb2.ObjectChange(type=kind, id=wid, json=doc)


def node(nid: str, status: str, cpu: int, used: float = 0.0) -> watch_pb2.ObjectChange:
    doc = {"id": nid, "status": status, "capabilities": {"cpuMillicores": cpu, "memoryMb": cpu, "diskMb": 10},
           "allocated": {"cpuMillicores": 100, "memoryMb": 50}, "usage": {"cpuPercent": used, "memoryUsedMb": 7},
           "cordoned": status == "Cordoned"}
    return watch_pb2.ObjectChange(type="MODIFIED", id=nid, json=json.dumps(doc).encode())


NODE_CHANGES = [node("n1", "Ready", 1000), watch_pb2.ObjectChange(type="SYNCED"), node("n2", "Ready", 2000, 50.0),
                node("n1", "NotReady", 1000), node("n3", "Ready", 500),
                watch_pb2.ObjectChange(type="DELETED", id="n3"), node("n2", "Ready", 2000, 25.0)]


class Changes:
    """Stands in for SchedulerClient.watch_objects: the given changes, then the stream stays open."""

    def __init__(self, workloads: list[watch_pb2.ObjectChange]) -> None:
        self.lists = {"workloads": workloads, "nodes": NODE_CHANGES}

    async def watch_objects(self, kind: str) -> AsyncIterator[watch_pb2.ObjectChange]:
        for msg in self.lists[kind]:
            yield msg
        await asyncio.Event().wait()


def test_counts_and_sums_follow_every_change() -> None:
    msgs = [change("ADDED", "a", "Pending"), change("ADDED", "b", "Running"), change("SYNCED", ""),
            change("MODIFIED", "a", "Running"), change("ADDED", "c", "Failed"), change("DELETED", "b"),
            change("DELETED", "zzz"), change("MODIFIED", "c", "Running"), change("ADDED", "d", "Pending")]

    async def run() -> tuple[dict[str, int], dict[str, Any], Any, Any]:
        view = ClusterView(Changes(msgs))  # type: ignore[arg-type]
        await view.ensure(())
        for _ in range(100):
            await asyncio.sleep(0)
        try:
            return ({k: v for k, v in view.phases.items() if v}, dict(view.workloads), view.overview(),
                    overview(view.nodes.values(), view.workloads.values()))
        finally:
            await view.close()

    phases, workloads, kept, walked = asyncio.run(run())
    assert phases == dict(phase_counts(workloads.values())) == {"Running": 2, "Pending": 1}
    assert kept == walked  # the figures kept as changes came equal those counted afresh
    assert kept.workloads == 3 and kept.nodes == 2 and kept.nodes_by_status == {"NotReady": 1, "Ready": 1}
    assert kept.cpu.allocatable == 2000 and kept.cpu.used == 500 and kept.cpu.requested == 200
