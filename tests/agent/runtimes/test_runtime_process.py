"""ProcessRuntime with real host processes (and real cgroup v1 limits when the host allows them)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from persys.agent.runtimes.base import RuntimeFailure, RuntimeState, RuntimeWorkload
from persys.agent.runtimes.process import ProcessRuntime
from persys.agent.runtimes.process_cgroups import CGROUP_CONTROLLERS
from persys.model.workload import ProcessSpec, Resources, WorkloadSpec
from tests.waiting import settled as wait_for

CG = Path("/sys/fs/cgroup")
SRC_DIR = str(Path(__file__).resolve().parents[3] / "src")


def wl(
    command: list[str], revision: str = "r1", wid: str | None = None, cpu: int = 250, mem: int = 32
) -> RuntimeWorkload:
    spec = WorkloadSpec(
        type="process",
        resources=Resources(cpu_millicores=cpu, memory_mb=mem),
        process=ProcessSpec(command=command, env={"GREETING": "hi"}),
    )
    wid = wid or f"t{uuid.uuid4().hex[:8]}"
    return RuntimeWorkload(workload_id=wid, revision=revision, generation=1, spec=spec)


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (orphans may linger as zombies if PID 1 does not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def argv0(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    r = ProcessRuntime(tmp_path, grace_seconds=2.0, isolate=False)
    yield r
    # Nothing may outlive the test: remove whatever is still recorded in the state dir.
    cleaner = ProcessRuntime(tmp_path, grace_seconds=0.5, isolate=False)
    for o in await cleaner.list():
        await cleaner.remove(o.workload_id)
    await r.close()
    for ctl in CGROUP_CONTROLLERS:  # this test agent's own cgroup directory
        with contextlib.suppress(OSError):
            (CG / ctl / r.cgroup_parent).rmdir()


async def test_probe(rt: ProcessRuntime) -> None:
    p = await rt.probe()
    assert p.available, p.reason
    assert ("cgroups:v1" if rt.cgroups_enabled else "cgroups:none") in p.features


async def test_start_own_group_limits_and_adoption(rt: ProcessRuntime, tmp_path: Path) -> None:
    w = wl(["sleep", "300"])
    obs = await rt.start(w)
    pid = int(obs.runtime_id)
    assert obs.state is RuntimeState.RUNNING and pid_alive(pid)
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # own session and process group

    async def execd() -> bool:  # the cgroup wrapper execs the command: same pid, no shell left
        return argv0(pid) == b"sleep"

    assert await wait_for(execd)

    if rt.cgroups_enabled:
        mem = CG / "memory" / rt.cgroup_parent / w.workload_id
        assert int((mem / "memory.limit_in_bytes").read_text()) == 32 * 1024 * 1024
        assert str(pid) in (mem / "cgroup.procs").read_text().split()
        cpu = CG / "cpu" / rt.cgroup_parent / w.workload_id
        assert int((cpu / "cpu.cfs_quota_us").read_text()) == 25_000
        assert int((cpu / "cpu.cfs_period_us").read_text()) == 100_000

    observed = await rt.inspect(w.workload_id)
    assert observed is not None and observed.usage.memory_bytes > 0

    # Same revision again: adopted, not restarted.
    assert (await rt.start(w)).runtime_id == obs.runtime_id

    # A new instance on the same state dir (agent restarted) adopts the same pid.
    rt2 = ProcessRuntime(tmp_path, grace_seconds=2.0, isolate=False)
    listed = {o.workload_id: o for o in await rt2.list()}
    assert listed[w.workload_id].runtime_id == obs.runtime_id
    assert listed[w.workload_id].state is RuntimeState.RUNNING
    adopted = await rt2.start(w)
    assert adopted.runtime_id == obs.runtime_id and adopted.started_at == obs.started_at

    # The new instance is not the parent, yet stops it and sees it gone.
    await rt2.stop(w.workload_id)
    assert not pid_alive(pid)
    after = await rt2.inspect(w.workload_id)
    assert after is not None and after.state is RuntimeState.STOPPED and after.exit_code is None
    if rt.cgroups_enabled:
        assert not (CG / "memory" / rt.cgroup_parent / w.workload_id).exists()


async def test_stop_kills_whole_group(rt: ProcessRuntime) -> None:
    w = wl(["sh", "-c", "sleep 300 & echo child=$!; wait"])
    obs = await rt.start(w)

    async def child_pid() -> int | None:
        m = re.search(r"child=(\d+)", await rt.logs(w.workload_id))
        return int(m.group(1)) if m else None

    child = await wait_for(child_pid)
    assert child and pid_alive(child) and os.getpgid(child) == int(obs.runtime_id)
    t0 = time.monotonic()
    await rt.stop(w.workload_id)
    assert time.monotonic() - t0 < 2.5
    assert not pid_alive(int(obs.runtime_id)) and not pid_alive(child)
    stopped = await rt.inspect(w.workload_id)
    assert stopped is not None and stopped.state is RuntimeState.STOPPED
    assert stopped.exit_code == -15  # we reaped it: killed by SIGTERM
    await rt.stop(w.workload_id)  # idempotent


async def test_sigterm_ignored_gets_killed_after_grace(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path, grace_seconds=0.5, isolate=False)
    w = wl(["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"])
    obs = await rt.start(w)
    assert await wait_for(lambda: _contains(rt, w.workload_id, "ready"))
    await rt.stop(w.workload_id)
    assert not pid_alive(int(obs.runtime_id))
    after = await rt.inspect(w.workload_id)
    assert after is not None and after.exit_code == -9
    await rt.remove(w.workload_id)


async def _contains(rt: ProcessRuntime, wid: str, text: str) -> bool:
    return text in await rt.logs(wid)


async def test_exit_code_and_logs(rt: ProcessRuntime) -> None:
    w = wl(["sh", "-c", "echo hello-$GREETING; echo oops >&2; exit 3"])
    await rt.start(w)

    async def finished() -> Any:
        o = await rt.inspect(w.workload_id)
        return o if o is not None and o.state is not RuntimeState.RUNNING else None

    obs = await wait_for(finished)
    assert obs is not None and obs.state is RuntimeState.FAILED and obs.exit_code == 3
    logs = await rt.logs(w.workload_id)
    assert "hello-hi" in logs and "oops" in logs
    assert (await rt.logs(w.workload_id, tail=1)).strip() == "oops"
    # Starting again after it exited spawns a new process (the agent's restart).
    again = await rt.start(w)
    assert again.runtime_id != obs.runtime_id


async def test_new_revision_replaces(rt: ProcessRuntime) -> None:
    w1 = wl(["sleep", "300"], revision="a")
    first = await rt.start(w1)
    w2 = wl(["sleep", "301"], revision="b", wid=w1.workload_id)
    second = await rt.start(w2)
    assert second.runtime_id != first.runtime_id and second.revision == "b"
    assert not pid_alive(int(first.runtime_id)) and pid_alive(int(second.runtime_id))
    await rt.remove(w1.workload_id)
    assert not pid_alive(int(second.runtime_id))
    assert await rt.inspect(w1.workload_id) is None
    await rt.remove(w1.workload_id)  # idempotent


async def test_cpu_limit_and_usage(rt: ProcessRuntime) -> None:
    w = wl(["sh", "-c", "while :; do :; done"], cpu=500)
    await rt.start(w)
    await rt.inspect(w.workload_id)  # first sample
    await asyncio.sleep(1.0)
    obs = await rt.inspect(w.workload_id)
    assert obs is not None and obs.usage.cpu_percent > 5  # loose: other load may share the CPUs
    if rt.cgroups_enabled:
        assert obs.usage.cpu_percent < 70  # the 500m quota holds it near 50% of one core


async def test_disk_writes_are_counted(rt: ProcessRuntime) -> None:
    """`persysctl top` shows a process's disk I/O (/proc/<pid>/io of its processes): here a child
    that wrote and exited, whose bytes its waiting parent's counters carry on."""
    # In its own working directory: the default workload user may write nowhere else.
    w = wl(["sh", "-c", "dd if=/dev/zero of=written bs=1M count=4 conv=fsync 2>/dev/null; exec sleep 300"])
    await rt.start(w)
    deadline = time.monotonic() + 30
    while True:
        obs = await rt.inspect(w.workload_id)
        assert obs is not None and obs.state is RuntimeState.RUNNING
        if obs.usage.disk_write_bytes >= 4 * 1024 * 1024 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert obs.usage.disk_write_bytes >= 4 * 1024 * 1024, obs.usage


async def test_invalid_command_is_terminal(rt: ProcessRuntime) -> None:
    with pytest.raises(RuntimeFailure) as ei:
        await rt.start(wl(["/no/such/binary"]))
    assert ei.value.code == "InvalidSpec" and ei.value.terminal


async def test_without_cgroups(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path, use_cgroups=False, isolate=False)
    assert "cgroups:none" in (await rt.probe()).features
    w = wl(["sleep", "300"])
    obs = await rt.start(w)
    got = await rt.inspect(w.workload_id)
    assert got is not None and got.state is RuntimeState.RUNNING and got.usage.memory_bytes > 0
    assert not (CG / "memory" / rt.cgroup_parent / w.workload_id).exists()
    await rt.remove(w.workload_id)
    assert not pid_alive(int(obs.runtime_id))


AGENT_SCRIPT = """
import asyncio, sys
from persys.agent.runtimes.base import RuntimeWorkload
from persys.agent.runtimes.process import ProcessRuntime
from persys.agent.runtimes.process_cgroups import CGROUP_CONTROLLERS
from persys.model.workload import ProcessSpec, WorkloadSpec

async def main():
    rt = ProcessRuntime(sys.argv[1], isolate=False)
    spec = WorkloadSpec(type="process", process=ProcessSpec(command=["sleep", "300"]))
    obs = await rt.start(RuntimeWorkload(workload_id=sys.argv[2], revision="r1", generation=1, spec=spec))
    await rt.close()
    print(obs.runtime_id)

asyncio.run(main())
"""


async def test_process_outlives_agent_and_is_adopted(rt: ProcessRuntime, tmp_path: Path) -> None:
    """A real agent process starts the workload and exits; a fresh runtime adopts the survivor."""
    wid = f"t{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        AGENT_SCRIPT,
        str(tmp_path),
        wid,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC_DIR},
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    pid = int(out.decode().split()[-1])
    assert pid_alive(pid)  # the agent is gone, the workload is not

    observed = await rt.inspect(wid)
    assert observed is not None and observed.state is RuntimeState.RUNNING
    assert observed.runtime_id == str(pid)
    spec = WorkloadSpec(type="process", process=ProcessSpec(command=["sleep", "300"]))
    adopted = await rt.start(RuntimeWorkload(workload_id=wid, revision="r1", generation=1, spec=spec))
    assert adopted.runtime_id == str(pid)
    await rt.remove(wid)
    assert not pid_alive(pid)
