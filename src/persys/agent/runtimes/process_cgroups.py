"""A process instance's cgroups (v1): where this agent's are, whether they can be used, made with
the instance's CPU and memory limits before it starts, read, and removed once it has stopped.

The instance moves itself into them (the process runtime's wrapper writes to each `tasks`), so
the command is limited from its first instruction; the limit arithmetic is `cgroup_limits`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from persys.agent.runtimes.base import RuntimeFailure, RuntimeWorkload
from persys.agent.runtimes.cgroup_limits import MEMORY, MEMSW, memory_limit_writes

CFS_PERIOD_US = 100_000
CGROUP_CONTROLLERS = ("cpu", "cpuacct", "memory", "pids")


def read_int(path: Path) -> int | None:
    """The first number a cgroup or proc file holds; None when unreadable."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class ProcessCgroups:
    """The cgroups under `root` (e.g. /sys/fs/cgroup) of this agent's directory `parent`
    (`persys/<cluster>-<agent>`), one per instance and controller."""

    def __init__(self, root: Path, parent: str) -> None:
        self.root = root
        self.parent = parent

    def writable(self) -> bool:
        """Whether the cpu and memory hierarchies are mounted and this agent may make its
        directory in them."""
        for ctl in ("cpu", "memory"):
            base = self.root / ctl
            if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
                return False
            try:
                (base / self.parent).mkdir(parents=True, exist_ok=True)
            except OSError:
                return False
        return True

    def dirs(self, workload_id: str) -> dict[str, Path]:
        return {
            ctl: self.root / ctl / self.parent / workload_id
            for ctl in CGROUP_CONTROLLERS
            if (self.root / ctl / "cgroup.procs").exists()
        }

    def recorded_dirs(self, recorded: list[str], workload_id: str) -> dict[str, Path]:
        """The cgroups an instance was started in, as recorded then: a process adopted after an
        agent upgrade may live under an older layout than the one computed now
        (`persys/<instance>` before `persys/<agent>/<instance>`). Unrecorded: the computed ones."""
        if not recorded:
            return self.dirs(workload_id)
        dirs: dict[str, Path] = {}
        for raw in recorded:
            d = Path(raw)
            try:
                ctl: str | None = d.relative_to(self.root).parts[0]
            except (ValueError, IndexError):
                ctl = next((c for c in CGROUP_CONTROLLERS if c in d.parts), None)
            if ctl is not None:
                dirs[ctl] = d
        return dirs

    def setup(self, w: RuntimeWorkload) -> list[str]:
        """The instance's cgroups made with its limits; the `tasks` files it moves itself into."""
        res = w.spec.resources
        dirs = self.dirs(w.workload_id)
        try:
            for d in dirs.values():
                d.mkdir(parents=True, exist_ok=True)
            if "cpu" in dirs:
                (dirs["cpu"] / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
                # 1000 millicores = one full period per period; the kernel minimum quota is 1 ms.
                quota = max(1000, res.cpu_millicores * CFS_PERIOD_US // 1000) if res.cpu_millicores else -1
                (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))
            if "memory" in dirs:
                limit = res.memory_mb * 1024 * 1024 if res.memory_mb else -1
                # The swap limit too, or the limit only bounds RAM and the rest spills to swap
                # (if any). The order depends on what a reused (leftover) cgroup holds now.
                mem = dirs["memory"]
                for name, value in memory_limit_writes(limit, read_int(mem / MEMORY), (mem / MEMSW).exists()):
                    (mem / name).write_text(str(value))
        except OSError as exc:
            raise RuntimeFailure(f"cgroup setup for {w.workload_id}: {exc}") from exc
        return [str(d / "tasks") for d in dirs.values()]

    def remove(self, recorded: list[str], workload_id: str) -> None:
        for d in self.recorded_dirs(recorded, workload_id).values():
            with contextlib.suppress(OSError):  # busy (a straggler still inside) or already gone
                d.rmdir()

    def pids(self, recorded: list[str], workload_id: str) -> list[int]:
        """Every process in the instance's cgroups."""
        pids: set[int] = set()
        for d in self.recorded_dirs(recorded, workload_id).values():
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return sorted(pids)
