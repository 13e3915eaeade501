"""What an agent tells the scheduler, over the real protocol (process runtime, real processes):
only what changed, and a complete report when something is gone. (Which reports go out is
decided by the pure persys.agent.decide.report, table-tested in test_report_builder.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from persys.agent.agent import Agent, AgentConfig
from persys.agent.link import GrpcLink
from persys.agent.runtimes.process import ProcessRuntime
from persys.model import parse_manifests
from persys.scheduler.mirror.reports import WorkloadReport
from persys.scheduler.rpc.server import RunningScheduler, start_scheduler
from persys.security.pki import ClusterCA, standard_identities
from tests.scheduler.test_core import manifest
from tests.waiting import until


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[RunningScheduler, Agent, list[tuple[bool, set[str]]]]]:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    sched = await start_scheduler(f"sqlite:///{tmp_path / 'state.db'}", "memory://", "127.0.0.1:0", ids["scheduler"])
    seen: list[tuple[bool, set[str]]] = []
    real = sched.scheduler.agent_api.report

    async def recording(node_id: str, reports: list[WorkloadReport], complete: bool, volumes: Any = None) -> Any:
        seen.append((complete, {r.workload_id for r in reports}))
        return await real(node_id, reports, complete, volumes)

    sched.scheduler.agent_api.report = recording  # type: ignore[method-assign]
    rt = ProcessRuntime(tmp_path / "agent" / "runtimes")
    agent = Agent(AgentConfig(node_id="n1", scheduler=f"127.0.0.1:{sched.port}", tls=ids["agent"],
                              state_dir=tmp_path / "agent", reconcile_interval=0.3), [rt])
    await agent.start()
    yield sched, agent, seen
    await agent.stop()
    await sched.stop()
    for o in await rt.list():  # its processes, uid claims and environment files go with it
        await rt.remove(o.workload_id)


async def test_reports_carry_changes_and_are_complete_when_something_is_gone(
        cluster: tuple[RunningScheduler, Agent, list[tuple[bool, set[str]]]]) -> None:
    sched, _agent, seen = cluster
    s = sched.scheduler
    for name in ("a", "b"):
        await s.workload_api.apply(parse_manifests(manifest(name))[0])
    await until(lambda: all(s.workload_view(w)["phase"] == "Running" for w in ("a", "b")))
    assert seen and seen[0][0], "the first report after connecting is complete"

    # Nothing new sends nothing: a decision of the pure report.select (tests/agent/report_cases).
    seen.clear()
    await s.workload_api.apply(parse_manifests(manifest("c"))[0])
    await until(lambda: s.workload_view("c")["phase"] == "Running")
    assert seen and all(not complete and ids == {"c"} for complete, ids in seen), seen

    seen.clear()
    await s.workload_api.delete("a")
    await until(lambda: "a" not in s.state.workloads)
    assert any(complete and ids == {"b", "c"} for complete, ids in seen), seen


async def test_agent_reopens_its_desired_state_stream_for_a_full_set(
        cluster: tuple[RunningScheduler, Agent, list[tuple[bool, set[str]]]]) -> None:
    """After a disconnection stop the agent may cancel its own WatchAssignments call (real gRPC:
    the stream ends in CancelledError) to get a full set: the loop goes on and one arrives."""
    _sched, agent, _seen = cluster
    link = agent.link
    assert isinstance(link, GrpcLink)
    await until(lambda: agent._full_set_at is not None and link._watch_call is not None)
    first = agent._full_set_at
    watch = next(t for t in agent._tasks if t.get_name() == "agent-watch")
    link.reopen_watch()
    await until(lambda: agent._full_set_at != first)
    assert not watch.done()
