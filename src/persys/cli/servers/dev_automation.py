"""The automation in `persys dev`: the loop (persys.automation.loop) as a client of the dev
scheduler with an identity of its own, `user:persys-automation` in persys:operators, so what it
does is authorized and audited as that identity, never as the local admin."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

from persys.security.pki import ClusterCA

AUTOMATION_USER = "user:persys-automation"
AUTOMATION_GROUPS = ("persys:operators",)


async def start_dev_automation(ca: ClusterCA, folder: Path, target: str, tick: float = 1.0
                               ) -> Callable[[], Awaitable[None]]:
    """Start the loop; returns what stops it (and closes its client)."""
    from persys.automation.disk_forecasts import NodeDiskForecasts
    from persys.automation.leadership import Leadership
    from persys.automation.loop import AutomationLoop
    from persys.client import SchedulerClient

    tls = ca.issue("automation", AUTOMATION_USER, groups=AUTOMATION_GROUPS, out=folder)
    client = SchedulerClient(target, tls)
    stop = asyncio.Event()
    # It takes the cluster's automation lease like any `persys automation`: one started beside
    # `persys dev` against the same scheduler stands by instead of acting twice.
    loop = AutomationLoop(client, tick=tick, leadership=Leadership(client), disk=NodeDiskForecasts(client))
    task = asyncio.create_task(loop.run(stop), name="persys-automation")

    async def stopped() -> None:
        stop.set()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        await client.close()

    return stopped
