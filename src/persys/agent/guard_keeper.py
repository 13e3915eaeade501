"""The agent's side of the node guard (persys.agent.node_guard): it renews the lease every
RENEW_EVERY seconds from the event loop (a frozen or killed agent stops renewing it), keeps a
guard process running, lists the Stop instances it runs and how to kill each, and hands what
the guard killed while no agent ran to the agent, which fences them."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from persys.agent import node_guard as ng
from persys.agent.runtimes.base import ObservedWorkload, RuntimeState
from persys.agent.runtimes.supervision import proc_info

log = logging.getLogger(__name__)


def fence_entry(instance: str, runtime: str, o: ObservedWorkload) -> dict[str, Any] | None:
    """How the guard kills one running instance (None: this runtime has no handle it can use)."""
    if runtime in ("process", "microvm"):
        pid = int(o.runtime_id) if o.runtime_id.isdigit() else 0
        info = proc_info(pid) if pid > 0 else None
        if info is None:
            return None
        # A process workload leads its own group (its children die with it); a VMM is one process.
        return {"instance": instance, "kind": "pid", "pid": pid, "startTicks": info.start_ticks,
                "group": runtime == "process"}
    if runtime == "container" and o.runtime_id:
        return {"instance": instance, "kind": "docker", "id": o.runtime_id}
    if runtime == "compose" and o.runtime_id:
        return {"instance": instance, "kind": "compose", "project": o.runtime_id}
    if runtime == "vm" and o.runtime_id:
        return {"instance": instance, "kind": "libvirt", "uuid": o.runtime_id}
    return None


def fence_entries(running: Iterable[tuple[str, str, ObservedWorkload]]) -> list[dict[str, Any]]:
    """`running`: (instance, runtime name, observation) of the Stop instances desired here."""
    out = []
    for instance, runtime, o in sorted(running, key=lambda r: r[0]):
        if o.state == RuntimeState.RUNNING and (entry := fence_entry(instance, runtime, o)) is not None:
            out.append(entry)
    return out


class GuardKeeper:
    def __init__(self, folder: Path, bound: Callable[[], float], on_fired: Callable[[dict[str, float]], None],
                 spawn: bool = True) -> None:
        self.folder = folder
        self.bound = bound  # the scheduler's node grace (node_guard.DEFAULT_BOUND until known)
        self.on_fired = on_fired
        self.spawn = spawn  # False: someone else runs the guard (tests drive it themselves)
        self._proc: subprocess.Popen[bytes] | None = None
        self._fence: list[dict[str, Any]] | None = None

    def renew(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        ng.write_lease(self.folder, ng.Lease(ng.now(), self.bound() or ng.DEFAULT_BOUND, os.getpid()))
        fired = ng.take_fired(self.folder)
        if fired:
            log.warning("the node guard killed %s while this agent did not renew its lease; they stay stopped "
                        "until the scheduler's desired state says where they belong", ", ".join(sorted(fired)))
            self.on_fired(fired)

    def ensure_guard(self) -> None:
        if not self.spawn:
            return
        if self._proc is not None and self._proc.poll() is None:
            return  # ours is running (or still starting: it takes the lock first thing)
        if ng.guard_running(self.folder):
            return  # one from an earlier agent of this node
        log_file = open(self.folder / "guard.log", "ab")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "persys.agent.node_guard_proc", str(self.folder)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True)  # its own session: a signal to the agent's group spares it
        finally:
            log_file.close()
        log.info("node guard started (pid %d) for %s", self._proc.pid, self.folder)

    def guard(self, entries: list[dict[str, Any]]) -> None:
        """The Stop instances to kill should the lease lapse (written when it changes)."""
        if entries != self._fence:
            self.folder.mkdir(parents=True, exist_ok=True)
            ng.write_fence(self.folder, entries)
            self._fence = entries

    async def run(self) -> None:
        while True:
            try:
                # On the event loop itself, not a worker thread: a frozen loop must let it lapse,
                # and a busy thread pool must not (a few hundred microseconds of file writes).
                self.renew()
                self.ensure_guard()
            except OSError as err:  # a full or failing disk: the guard may fire, say why
                log.error("could not renew the node guard's lease in %s: %s", self.folder, err)
            await asyncio.sleep(ng.RENEW_EVERY)
