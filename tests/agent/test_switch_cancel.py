"""A replica switch closes the old channel, and grpc.aio raises CancelledError in whoever awaits
one of its calls: the link's loops (persys.agent.link) must survive that (and only that), the
acknowledgement watchdog keeps watching a stream it could not leave, and an agent loop that dies
says so."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.agent import Agent, AgentConfig
from persys.agent.decide.plan import Desired
from persys.agent.failover import AckDeadline
from persys.agent.link import PROBE_TIMEOUT, REPROBE_EVERY, GrpcLink
from persys.model import DesiredState, WorkloadSpec
from tests.waiting import until as _until


class SwitchingStub:
    """Each method's first call behaves like a call on a channel closed by a switch: the agent's
    channel generation moves on and the call raises CancelledError; later calls answer."""

    def __init__(self, link: GrpcLink) -> None:
        self.link = link
        self.calls: dict[str, int] = {}

    async def _call(self, name: str, answer: Any) -> Any:
        n = self.calls[name] = self.calls.get(name, 0) + 1
        if n == 1:
            self.link._channel_gen += 1
            raise asyncio.CancelledError
        return answer

    async def RegisterNode(self, req: Any, **kw: Any) -> Any:
        return await self._call("RegisterNode", pb.RegisterNodeResponse(heartbeat_interval_seconds=0))

    async def Heartbeat(self, req: Any, **kw: Any) -> Any:
        return await self._call("Heartbeat", pb.HeartbeatResponse(acknowledged=True))

    async def ReportStatus(self, req: Any, **kw: Any) -> Any:
        return await self._call("ReportStatus", pb.ReportStatusResponse())


def _agent(tmp_path: Path, **kw: Any) -> tuple[Agent, GrpcLink]:
    """An agent with its link, both unstarted (the tests drive single loops)."""
    config = AgentConfig(node_id="n1", scheduler="a", state_dir=tmp_path / "agent", **kw)
    agent = Agent(config, [])
    assert isinstance(agent.link, GrpcLink)
    return agent, agent.link


@pytest.mark.parametrize(("loop", "method"), [
    ("_register_loop", "RegisterNode"),
    ("_heartbeat_loop", "Heartbeat"),
    ("_reconcile_loop", "ReportStatus"),
])
async def test_loops_survive_a_switch_under_their_call(tmp_path: Path, loop: str, method: str) -> None:
    agent, link = _agent(tmp_path, reconcile_interval=0.05)
    link.heartbeat_interval = 0.05
    stub = SwitchingStub(link)
    link._stub = stub  # type: ignore[assignment]
    if loop != "_register_loop":
        link.registered.set()
    owner = agent if loop == "_reconcile_loop" else link  # reports go out through the link
    task = asyncio.create_task(getattr(owner, loop)())
    try:
        await _until(lambda: stub.calls.get(method, 0) >= 2)
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        agent.local.close()


async def test_a_cancelled_call_without_a_switch_still_ends_the_loop(tmp_path: Path) -> None:
    agent, link = _agent(tmp_path)

    class Cancelled:
        async def RegisterNode(self, req: Any, **kw: Any) -> Any:
            raise asyncio.CancelledError

    link._stub = Cancelled()  # type: ignore[assignment]
    with pytest.raises(asyncio.CancelledError):
        await link._register_loop()
    agent.local.close()


async def test_ack_watchdog_rearms_when_there_is_nowhere_to_go(tmp_path: Path) -> None:
    agent, link = _agent(tmp_path, ack_deadline=0.1)  # one replica: _move stays
    moves: list[float] = []
    real_move = link._move

    async def move(code: str, pointer: str, gen: int, why: str) -> None:
        moves.append(time.monotonic())
        await real_move(code, pointer, gen, why)

    link._move = move  # type: ignore[method-assign]
    deadline = AckDeadline(0.1, time.monotonic())
    watchdog = asyncio.create_task(link._ack_watchdog(deadline, link._channel_gen))
    await _until(lambda: len(moves) >= 3)
    assert all(b - a >= 0.09 for a, b in itertools.pairwise(moves)), "a full deadline between tries"
    link._channel_gen += 1  # switched by another loop: this stream's watchdog is done
    # It notices at its next look: after the re-probe pause, or after a probe already under way.
    await asyncio.wait_for(watchdog, REPROBE_EVERY + PROBE_TIMEOUT + 5.0)
    agent.local.close()


async def test_a_loop_that_ends_while_the_agent_runs_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent, _link = _agent(tmp_path)

    async def dies() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(dies(), name="agent-test")
    task.add_done_callback(agent._task_ended)
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError):
        await task
    await asyncio.sleep(0)
    assert any("agent-test" in r.getMessage() and "boom" in r.getMessage() for r in caplog.records)
    agent.local.close()


class FakeWatch:
    """A WatchAssignments call that yields nothing and ends like grpc.aio's when cancelled."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True

    def __aiter__(self) -> FakeWatch:
        return self

    async def __anext__(self) -> Any:
        await self.cancelled.wait()
        raise asyncio.CancelledError


async def test_reopening_the_watch_for_a_full_set_keeps_the_loop(tmp_path: Path) -> None:
    agent, link = _agent(tmp_path)
    calls: list[FakeWatch] = []

    class Stub:
        def WatchAssignments(self, req: Any, **kw: Any) -> FakeWatch:
            calls.append(FakeWatch())
            return calls[-1]

    link._stub = Stub()  # type: ignore[assignment]
    link.registered.set()
    task = asyncio.create_task(link._watch_loop())
    try:
        await _until(lambda: link._watch_call is not None)
        link.reopen_watch()
        link.reopen_watch()  # asked again at once: one reopening is enough
        await _until(lambda: len(calls) == 2 and link._watch_call is calls[1])
        assert calls[0].cancelled.is_set() and not calls[1].cancelled.is_set()
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        agent.local.close()


async def test_acks_after_a_disconnection_stop_without_a_full_set_reopen_the_watch(tmp_path: Path) -> None:
    agent, link = _agent(tmp_path)
    spec = WorkloadSpec.model_validate({"type": "process", "process": {"command": ["sleep", "1"]},
                                        "onDisconnect": "Stop"})
    agent.desired["db"] = Desired("r1", 1, DesiredState.RUNNING, spec)
    link.node_grace = 10.0
    now = time.monotonic()
    agent.fenced["db"] = now - 2.0
    agent._full_set_at = now - 60.0
    link.contact.contact(now - 1.0)  # acknowledged after the stop, no full set since
    watch = FakeWatch()
    link._watch_call = watch
    task = asyncio.create_task(agent._disconnect_loop())
    try:
        await asyncio.wait_for(watch.cancelled.wait(), 2.0)
        assert link._watch_reopen and "db" in agent.fenced  # released only by the full set
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        agent.local.close()
