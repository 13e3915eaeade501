"""A process adopted after an agent upgrade is tracked in the cgroups it was started in (as
recorded in its meta), not the ones this agent would compute now. A fake cgroup tree: no root."""

from __future__ import annotations

from pathlib import Path

import pytest

from persys.agent.runtimes.process import ProcessMeta, ProcessRuntime
from persys.agent.runtimes.process_cgroups import CGROUP_CONTROLLERS


def _meta(cgroups: list[str]) -> ProcessMeta:
    return ProcessMeta("w1", "r1", 1, ["sleep", "1"], 999_999, 999_999, 0, 0.0, cgroups=cgroups)


@pytest.fixture
def rt(tmp_path: Path) -> ProcessRuntime:
    root = tmp_path / "cg"
    for ctl in CGROUP_CONTROLLERS:
        (root / ctl).mkdir(parents=True)
        (root / ctl / "cgroup.procs").write_text("")
    return ProcessRuntime(tmp_path / "state", cgroup_root=root, use_cgroups=True, agent_id="n1")


def _cgroup(root: Path, ctl: str, rel: str, **files: str) -> Path:
    d = root / ctl / rel
    d.mkdir(parents=True)
    for name, text in {"cgroup.procs": "", **files}.items():
        (d / name).write_text(text)
    return d


def test_recorded_legacy_cgroups_are_used(rt: ProcessRuntime, tmp_path: Path) -> None:
    root = tmp_path / "cg"
    mem = _cgroup(root, "memory", "persys/w1", **{"cgroup.procs": "4242\n", "memory.usage_in_bytes": "777"})
    cpu = _cgroup(root, "cpuacct", "persys/w1", **{"cgroup.procs": "4243\n", "cpuacct.usage": "555"})
    # What this agent would compute now, with other contents: must not be read for this meta.
    _cgroup(root, "memory", f"{rt.cgroup_parent}/w1", **{"cgroup.procs": "1\n", "memory.usage_in_bytes": "1"})
    meta = _meta([str(mem), str(cpu)])
    assert rt._meta_cg_dirs(meta) == {"memory": mem, "cpuacct": cpu}
    assert rt._cgroup_pids(meta) == [4242, 4243]
    assert rt._memory(meta) == 777
    assert rt._cpu_ns(meta) == 555


def test_unrecorded_cgroups_fall_back_to_the_computed_path(rt: ProcessRuntime, tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _cgroup(root, "memory", f"{rt.cgroup_parent}/w1", **{"cgroup.procs": "4244\n", "memory.usage_in_bytes": "9"})
    meta = _meta([])
    assert rt._meta_cg_dirs(meta)["memory"] == root / "memory" / rt.cgroup_parent / "w1"
    assert rt._cgroup_pids(meta) == [4244]
    assert rt._memory(meta) == 9


def test_recorded_under_another_root_is_mapped_by_controller_name(rt: ProcessRuntime) -> None:
    meta = _meta(["/sys/fs/cgroup/memory/persys/w1", "/elsewhere/nothing"])
    assert rt._meta_cg_dirs(meta) == {"memory": Path("/sys/fs/cgroup/memory/persys/w1")}
