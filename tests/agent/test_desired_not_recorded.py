"""A node whose disk is full cannot record the desired set it is sent: the agent's watch must not
die of it (it did: the write's error ended the loop, and the node never heard of an assignment
again). The fault is real: the agent's state lives on a 1 MiB tmpfs that a file fills up; the
scheduler's stream is a stub that hands out a full set per call."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from pathlib import Path
from typing import Any

import pytest

from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.agent import Agent, AgentConfig
from persys.agent.link import GrpcLink
from persys.model import WorkloadSpec
from tests.agent.test_switch_cancel import _until
from tests.small_disk import fill


class OneSetWatch:
    """A WatchAssignments call that yields one full set, then waits until cancelled."""

    def __init__(self, ds: pb.AssignmentSet) -> None:
        self.ds, self.sent, self.cancelled = ds, False, asyncio.Event()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True

    def __aiter__(self) -> OneSetWatch:
        return self

    async def __anext__(self) -> pb.AssignmentSet:
        if not self.sent:
            self.sent = True
            return self.ds
        await self.cancelled.wait()
        raise asyncio.CancelledError


async def test_a_full_disk_has_the_watch_ask_for_the_full_set_again(small_disk: Path) -> None:
    agent = Agent(AgentConfig(node_id="n1", scheduler="a", state_dir=small_disk / "agent"), [])
    link = agent.link
    assert isinstance(link, GrpcLink)
    spec = WorkloadSpec.model_validate({"type": "process", "process": {"command": ["sleep", "60"],
                                                                       "env": {"PAD": "x" * 20_000}}})
    ds = pb.AssignmentSet(full=True, workloads=[pb.AssignedWorkload(
        instance_id="web", revision="r1", generation=1, desired_state="Running", spec_json=spec.to_json())])
    filler = fill(small_disk)
    calls: list[OneSetWatch] = []
    asked: list[float] = []

    class Stub:
        def WatchAssignments(self, req: Any, **kw: Any) -> OneSetWatch:  # noqa: N802
            asked.append(time.monotonic())
            if len(calls) == 2:  # asked a third time: the operator has freed the disk meanwhile
                filler.unlink(missing_ok=True)
            calls.append(OneSetWatch(ds))
            return calls[-1]

    link._stub = Stub()  # type: ignore[assignment]
    link.registered.set()
    task = asyncio.create_task(link._watch_loop())
    try:
        await _until(lambda: "web" in agent.local.desired(), 10.0)
        assert len(calls) == 3 and calls[0].cancelled.is_set() and calls[1].cancelled.is_set() and not task.done()
        assert agent.desired["web"].revision == "r1"
        # Backing off while the disk refuses each set (0.2 s, then 0.4 s): not every 0.2 s for ever.
        assert asked[1] - asked[0] >= 0.19 and asked[2] - asked[1] >= 0.39, asked
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        agent.local.close()


def test_the_fault_is_real(small_disk: Path) -> None:
    fill(small_disk)
    with pytest.raises(OSError) as err:
        (small_disk / "more").write_bytes(b"\0" * 8192)
    assert err.value.errno == errno.ENOSPC
