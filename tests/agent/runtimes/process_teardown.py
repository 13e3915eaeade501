"""The end of a process-runtime fixture: nothing the test started outlives it."""

from __future__ import annotations

import contextlib
from pathlib import Path

from persys.agent.runtimes.process import ProcessRuntime
from persys.agent.runtimes.process_cgroups import CGROUP_CONTROLLERS

CG = Path("/sys/fs/cgroup")


async def tear_down(r: ProcessRuntime) -> None:
    """Remove every workload `r` still records, close it, and remove its (then empty) cgroup
    folder under each controller."""
    for o in await r.list():
        await r.remove(o.workload_id)
    await r.close()
    for ctl in CGROUP_CONTROLLERS:
        with contextlib.suppress(OSError):
            (CG / ctl / r.cgroup_parent).rmdir()
