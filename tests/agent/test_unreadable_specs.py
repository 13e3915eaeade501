"""A workload whose stored spec the (now stricter) model refuses: the scheduler quarantines it
and still lists it for its node; the agent must keep its running instance as it is, not remove
it as an orphan (after an agent upgrade, from the scheduler's list or its own local record)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.agent import Agent, AgentConfig
from persys.agent.localstate import LocalState
from persys.agent.runtimes.base import LogQuery, ObservedWorkload, Probe, RuntimeState, RuntimeWorkload

BAD = b'{"type": "process", "command": 42, "unknownField": true}'


class FakeRuntime:
    name = "process"

    def __init__(self, running: list[str]) -> None:
        self.running = set(running)
        self.removed: list[str] = []

    async def probe(self) -> Probe:
        return Probe(True)

    async def start(self, w: RuntimeWorkload) -> ObservedWorkload:
        raise AssertionError(f"nothing is started here ({w.workload_id})")

    async def stop(self, workload_id: str) -> None:
        raise AssertionError("nothing is stopped here")

    async def remove(self, workload_id: str) -> None:
        self.running.discard(workload_id)
        self.removed.append(workload_id)

    async def list(self) -> list[ObservedWorkload]:
        return [ObservedWorkload(w, "r1", 1, RuntimeState.RUNNING, "1") for w in sorted(self.running)]

    async def inspect(self, workload_id: str) -> ObservedWorkload | None:
        return None

    async def logs(self, workload_id: str, tail: int = 100) -> str:
        return ""

    async def stream_logs(self, workload_id: str, query: LogQuery) -> AsyncIterator[str]:
        yield ""

    async def close(self) -> None:
        return None


def _full(*ids: str) -> pb.AssignmentSet:
    return pb.AssignmentSet(mode="normal", full=True, workloads=[
        pb.AssignedWorkload(instance_id=w, revision="r1", generation=1, desired_state="Running", spec_json=BAD)
        for w in ids])


async def _agent(tmp_path: Path, rt: FakeRuntime) -> Agent:
    agent = Agent(AgentConfig(node_id="n1", scheduler="a", state_dir=tmp_path / "agent", orphan_grace=0.0), [rt])
    await agent.probe_runtimes()
    return agent


async def test_instance_listed_with_an_unreadable_spec_is_kept(tmp_path: Path) -> None:
    rt = FakeRuntime(["quarantined", "stray"])
    agent = await _agent(tmp_path, rt)
    await agent.accept_desired(_full("quarantined"))
    await agent.reconcile_once()
    await agent.reconcile_once()
    assert rt.removed == ["stray"] and rt.running == {"quarantined"}

    await agent.accept_desired(pb.AssignmentSet(mode="normal", removed=["quarantined"]))  # deleted
    await agent.reconcile_once()
    assert rt.removed == ["stray", "quarantined"]
    agent.local.close()


async def test_unreadable_local_record_is_kept_until_the_scheduler_drops_it(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    local = LocalState(tmp_path / "agent" / "agent.db")
    local.save_desired("old", "r1", 1, "Running", BAD.decode())
    local.close()
    rt = FakeRuntime(["old"])
    agent = await _agent(tmp_path, rt)
    await agent.accept_desired(_full("old"))  # still listed (quarantined)
    await agent.reconcile_once()
    assert rt.removed == []
    await agent.accept_desired(_full())  # no longer listed: gone like any other
    await agent.reconcile_once()
    assert rt.removed == ["old"] and "old" not in agent.local.desired()
    agent.local.close()
