"""Process-runtime cgroups: per-agent names and a memory-limit order that works from any state.

The ordering is table-driven (cgroup_cases/memory_limits.yaml), replayed under the kernel's
rule; the rest runs real processes in real cgroup v1 hierarchies and removes what it creates.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from persys.agent.runtimes.base import RuntimeState
from persys.agent.runtimes.cgroup_limits import MEMORY, MEMSW, memory_limit_writes
from persys.agent.runtimes.process import ProcessRuntime
from persys.agent.runtimes.process_cgroups import CGROUP_CONTROLLERS
from tests.agent.runtimes.test_runtime_process import CG, pid_alive, wait_for, wl
from tests.cases import load

CASES = load(__file__, "cgroup_cases/memory_limits.yaml")
NAMES = {"memory": MEMORY, "memsw": MEMSW}


def _inf(v: int | None) -> float:
    return float("inf") if v is None or v < 0 else float(v)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_memory_limit_order(case: dict[str, Any]) -> None:
    mem, memsw = case["start"]
    has_memsw = case.get("memsw", True)
    current = None if case.get("current_unknown") else mem
    writes = memory_limit_writes(case["target"], current, has_memsw)
    assert writes == [(NAMES[n], v) for n, v in case["expect"]]
    for name, value in writes:  # the kernel's rule: memory <= memsw after every write
        if name == MEMORY:
            mem = value
        else:
            memsw = value
        if has_memsw:
            assert _inf(mem) <= _inf(memsw), (name, value, mem, memsw)
    assert mem == case["target"] and (not has_memsw or memsw == case["target"])


async def _in(cgroup: Path, pid: int | str) -> bool:
    """Whether `pid` is (soon) the one process in `cgroup`: the wrapper joins it, then execs."""

    async def joined() -> bool:
        return (cgroup / "cgroup.procs").read_text().split() == [str(pid)]

    return bool(await wait_for(joined))


def _runtime(tmp: Path, agent: str) -> ProcessRuntime:
    rt = ProcessRuntime(tmp / agent, grace_seconds=1.0, agent_id=agent, isolate=False)  # one process per cgroup
    if not rt.cgroups_enabled:
        pytest.skip("cgroup v1 hierarchy not writable here")
    return rt


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[str]]:
    names = [f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"]
    yield names
    for name in names:  # every cgroup these agents created, innermost first
        for ctl in CGROUP_CONTROLLERS:
            base = CG / ctl / "persys" / name
            if base.exists():
                for d in base.iterdir():
                    if d.is_dir():
                        with contextlib.suppress(OSError):
                            d.rmdir()
                with contextlib.suppress(OSError):
                    base.rmdir()


async def test_two_agents_same_workload_id_do_not_share_a_cgroup(tmp_path: Path, agents: list[str]) -> None:
    a, b = (_runtime(tmp_path, n) for n in agents)
    w = wl(["sleep", "300"], wid="web")
    try:
        pa, pb = int((await a.start(w)).runtime_id), int((await b.start(w)).runtime_id)
        assert pa != pb
        ca, cb = CG / "memory" / a.cgroup_parent / "web", CG / "memory" / b.cgroup_parent / "web"
        assert ca != cb and ca.parent.name == agents[0] and ca.parent.parent.name == "persys"
        assert await _in(ca, pa) and await _in(cb, pb)
        await a.stop("web")  # one agent's stop must not touch the other's process or cgroup
        assert not pid_alive(pa) and not ca.exists()
        assert pid_alive(pb) and await _in(cb, pb)
        got = await b.inspect("web")
        assert got is not None and got.state is RuntimeState.RUNNING
    finally:
        await a.remove("web")
        await b.remove("web")


@pytest.mark.parametrize("leftover", [(8, 8), (8, 16), (128, 128)], ids=["lower", "odd", "higher"])
async def test_leftover_cgroup_with_other_limits_is_reused(tmp_path: Path, agents: list[str],
                                                           leftover: tuple[int, int]) -> None:
    rt = _runtime(tmp_path, agents[0])
    mem_dir = CG / "memory" / rt.cgroup_parent / "web"
    mem_dir.mkdir(parents=True)  # a previous run of this agent left it behind, with its limits
    mib = 1024 * 1024
    has_memsw = (mem_dir / MEMSW).exists()
    (mem_dir / MEMORY).write_text(str(leftover[0] * mib))  # fresh: both unlimited, memory goes first
    if has_memsw:
        (mem_dir / MEMSW).write_text(str(leftover[1] * mib))
    try:
        obs = await rt.start(wl(["sleep", "300"], wid="web", mem=64))
        assert obs.state is RuntimeState.RUNNING
        assert int((mem_dir / MEMORY).read_text()) == 64 * mib
        if has_memsw:
            assert int((mem_dir / MEMSW).read_text()) == 64 * mib
        assert await _in(mem_dir, obs.runtime_id)
    finally:
        await rt.remove("web")
    assert not mem_dir.exists()
