"""persysctl exec in a process workload, with real host processes: the command sees the running
instance's env, working directory and user, joins its cgroups (when the host has them), its
output is bounded and the timeout kills it and what it started."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persys.agent.runtimes.base import RuntimeFailure, RuntimeWorkload
from persys.agent.runtimes.process import ProcessRuntime
from persys.model.limits import EXEC_OUTPUT_MAX_BYTES
from persys.model.workload import ProcessSpec, Resources, WorkloadSpec
from tests.agent.runtimes.process_teardown import tear_down
from tests.agent.runtimes.test_runtime_process import argv0, wait_for

CG = Path("/sys/fs/cgroup")


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    r = ProcessRuntime(tmp_path, grace_seconds=1.0, isolate=False)
    yield r
    await tear_down(r)


async def _started(rt: ProcessRuntime, tmp_path: Path) -> str:
    wid = f"t{uuid.uuid4().hex[:8]}"
    work = tmp_path / "work"
    work.mkdir(mode=0o777)
    spec = WorkloadSpec(type="process", resources=Resources(cpu_millicores=200, memory_mb=64),
                        process=ProcessSpec(command=["sleep", "60"], env={"GREETING": "hello from env"},
                                            working_dir=str(work)))
    await rt.start(RuntimeWorkload(workload_id=wid, revision="r1", generation=1, spec=spec))
    return wid


async def test_exec_sees_the_workloads_environment(rt: ProcessRuntime, tmp_path: Path) -> None:
    wid = await _started(rt, tmp_path)
    out = await rt.exec(wid, ["sh", "-c", 'echo "$GREETING"; pwd; id -u; cat /proc/self/cgroup; echo oops >&2; exit 3'],
                        service="", kill_after=20)
    lines = out.stdout.decode().splitlines()
    assert lines[:2] == ["hello from env", str(tmp_path / "work")], out
    meta = rt._load(wid)
    assert meta is not None
    assert lines[2] == _uid_of(meta.pid)  # its user
    if rt.cgroups_enabled:
        assert any(line.endswith(f"/{wid}") for line in lines[3:]), lines  # inside its cgroups
    assert (out.stderr, out.exit_code, out.timed_out, out.truncated) == (b"oops\n", 3, False, False)


async def test_exec_joins_the_cgroups_of_an_instance_an_older_agent_started(rt: ProcessRuntime,
                                                                            tmp_path: Path) -> None:
    wid = await _started(rt, tmp_path)
    meta = rt._load(wid)
    assert meta is not None and _uid_of(meta.pid) != "0"
    if not rt.cgroups_enabled:
        pytest.skip("no writable cgroup v1 hierarchy here")

    async def in_its_cgroups() -> bool:  # the wrapper joined them all and exec'd the command
        return argv0(meta.pid) == b"sleep"

    assert await wait_for(in_its_cgroups)
    for d in meta.cgroups:  # agents before handed the user cgroup.procs only: its `tasks` is root's
        os.chown(Path(d) / "tasks", 0, 0)
    out = await rt.exec(wid, ["cat", "/proc/self/cgroup"], service="", kill_after=20)
    joined = {line.split(":")[1] for line in out.stdout.decode().splitlines() if line.endswith(f"/{wid}")}
    assert out.exit_code == 0 and {"memory", "pids"} <= joined and any("cpu" in j for j in joined), out


async def test_exec_output_is_bounded(rt: ProcessRuntime, tmp_path: Path) -> None:
    wid = await _started(rt, tmp_path)
    out = await rt.exec(wid, ["sh", "-c", f"head -c {EXEC_OUTPUT_MAX_BYTES + 100000} /dev/zero; echo done >&2"],
                        service="", kill_after=20)
    assert out.truncated and len(out.stdout) + len(out.stderr) == EXEC_OUTPUT_MAX_BYTES
    assert out.exit_code == 0


async def test_timeout_kills_the_command_and_what_it_started(rt: ProcessRuntime, tmp_path: Path) -> None:
    wid = await _started(rt, tmp_path)
    marker = uuid.uuid4().hex
    started = time.monotonic()
    out = await rt.exec(wid, ["sh", "-c", f"sleep 300 {marker} & sleep 301; echo never"], service="", kill_after=1)
    assert out.timed_out and out.exit_code == 137 and b"never" not in out.stdout
    assert time.monotonic() - started < 10
    assert not _processes_naming(marker)


def _uid_of(pid: int) -> str:
    return Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0]


def _processes_naming(marker: str) -> list[Path]:
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and marker.encode() in (proc / "cmdline").read_bytes():
                found.append(proc)
    return found


async def test_missing_command_and_no_instance(rt: ProcessRuntime, tmp_path: Path) -> None:
    wid = await _started(rt, tmp_path)
    out = await rt.exec(wid, ["no-such-command-xyz"], service="", kill_after=10)
    assert out.exit_code == 127 and b"not found" in out.stderr
    with pytest.raises(RuntimeFailure, match="has no process on this node"):
        await rt.exec("ghost", ["true"], service="", kill_after=10)
    with pytest.raises(RuntimeFailure, match="compose service"):
        await rt.exec(wid, ["true"], service="db", kill_after=10)
    await rt.stop(wid)
    with pytest.raises(RuntimeFailure, match="is not running"):
        await rt.exec(wid, ["true"], service="", kill_after=10)
