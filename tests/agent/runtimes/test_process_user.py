"""Which user a process workload runs as: the agent's unprivileged workload user by default,
another named user or root when the spec says so (the scheduler's policy decides whether it may),
limited by its cgroups all the same. Real processes; the agent here runs as root."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persys.agent.runtimes.base import RuntimeFailure, RuntimeState, RuntimeWorkload
from persys.agent.runtimes.process import ProcessRuntime
from persys.model.workload import ProcessSpec, Resources, WorkloadSpec
from tests.agent.runtimes.process_teardown import tear_down
from tests.agent.runtimes.test_runtime_process import CG, pid_alive, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root agent")


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    r = ProcessRuntime(tmp_path, grace_seconds=1.0, isolate=False)
    yield r
    await tear_down(r)


def _uid(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


def _as(user: str | None, command: list[str]) -> RuntimeWorkload:
    spec = WorkloadSpec(type="process", resources=Resources(cpu_millicores=100, memory_mb=32),
                        process=ProcessSpec(command=command, user=user))
    return RuntimeWorkload(workload_id=f"u{uuid.uuid4().hex[:8]}", revision="r1", generation=1, spec=spec)


async def test_default_is_the_unprivileged_workload_user_in_its_cgroup(rt: ProcessRuntime, tmp_path: Path) -> None:
    w = _as(None, ["sh", "-c", "touch made-here && exec sleep 300"])
    obs = await rt.start(w)
    pid = int(obs.runtime_id)
    assert await wait_for(lambda: _async(Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep")))
    assert _uid(pid) == 65534  # nobody
    work = tmp_path / "process" / w.workload_id / "work"
    assert await wait_for(lambda: _async((work / "made-here").exists()))  # its own working directory
    assert (work / "made-here").stat().st_uid == 65534
    if rt.cgroups_enabled:  # the wrapper moved itself in after dropping root
        procs = (CG / "memory" / rt.cgroup_parent / w.workload_id / "cgroup.procs").read_text().split()
        assert str(pid) in procs
    await rt.remove(w.workload_id)
    assert not pid_alive(pid)


async def test_root_when_the_spec_says_so(rt: ProcessRuntime) -> None:
    obs = await rt.start(_as("root", ["sleep", "300"]))
    assert obs.state is RuntimeState.RUNNING and _uid(int(obs.runtime_id)) == 0


async def test_an_unknown_user_is_a_terminal_invalid_spec(rt: ProcessRuntime) -> None:
    with pytest.raises(RuntimeFailure) as caught:
        await rt.start(_as("no-such-user-here", ["sleep", "300"]))
    assert caught.value.terminal and caught.value.code == "InvalidSpec"


async def _async(value: object) -> object:
    return value
