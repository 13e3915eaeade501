"""The volume controller: on the active replica, carries network volumes' records (nfs, ceph-rbd:
reachable from the control plane, unlike a node's local disk) to their backend. A Pending
volume is provisioned (cloned from its source where it has one), a grown one resized, a
Deleting one removed with its record. Decisions are pure (`actions`); each step is idempotent,
so a replica that dies mid-way leaves work the next active replica finishes. Local volumes are
provisioned by their node's agent at first attach, and their other steps are the node's work too
(`node_volumes`).

A failed step marks the record Failed with the driver's reason (shown by `describe volume`) and
is retried after a pause; writes are fenced by the leader key, so a deposed replica writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from persys.model.volume import Volume
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import put_doc
from persys.scheduler.rules.volume_steps import Action, Outcome, actions, done, failed
from persys.scheduler.work.shell import Shell
from persys.storage.base import StorageError, VolumeDriver, VolumeInfo
from persys.store.base import Compare, Delete

__all__ = ["VolumeController", "actions"]
log = logging.getLogger(__name__)
RETRY_S = 10.0  # a failed step waits this long before it is tried again
IDLE_S = 30.0  # with nothing to do, look again this often (changes wake it at once)


def _source(v: Volume) -> tuple[str, str] | None:
    src = v.spec.source
    if src is None:
        return None
    return ("snapshot", src.snapshot) if src.snapshot is not None else ("volume", src.volume or "")


class VolumeController:
    def __init__(self, shell: Shell, drivers: Mapping[str, VolumeDriver]) -> None:
        self.s = shell
        self.drivers = {k: d for k, d in drivers.items() if k != "local"}
        self.not_before: dict[str, float] = {}
        self._wake = asyncio.Event()

    def add_driver(self, name: str, driver: VolumeDriver) -> None:
        """A backend that became usable later (ceph-rbd once its key is in the secret store)."""
        self.drivers[name] = driver
        self._wake.set()

    def _on_change(self, kind: str, ident: str) -> None:
        if kind in ("volume", "reset"):
            self._wake.set()

    async def run(self) -> None:
        self.s.state.subscribe(self._on_change)
        try:
            while True:
                self._wake.clear()
                for a in actions(self.s.state.volumes, self.drivers, self.not_before, time.monotonic()):
                    await self._do(a)
                now = time.monotonic()
                retry_in = min((t - now for t in self.not_before.values() if t > now), default=IDLE_S)
                try:
                    await asyncio.wait_for(self._wake.wait(), min(IDLE_S, max(0.5, retry_in)))
                except TimeoutError:
                    pass
        finally:
            self.s.state.unsubscribe(self._on_change)

    async def _do(self, a: Action) -> None:
        v, driver = a.volume, self.drivers[a.volume.spec.driver]
        try:
            if a.kind == "delete":
                await asyncio.to_thread(driver.delete, v.id)
                info: VolumeInfo | None = None
            elif a.kind == "provision":
                info = await asyncio.to_thread(driver.provision, v.id, v.spec.size_mb, source=_source(v))
            elif a.kind == "resize":
                info = await asyncio.to_thread(driver.resize, v.id, v.spec.size_mb)
            else:
                step = driver.snapshot if a.kind == "snapshot" else driver.delete_snapshot
                await asyncio.to_thread(step, v.id, a.snapshot)
                info = await asyncio.to_thread(driver.info, v.id)
        except StorageError as err:
            self.not_before[v.id] = time.monotonic() + RETRY_S
            await self._failed(a, str(err))
            return
        self.not_before.pop(v.id, None)
        await self._done(a, info)

    async def _done(self, a: Action, info: VolumeInfo | None) -> None:
        await write_outcome(self.s, a, done(a, None if info is None else info.size_mb,
                                            info.snapshots if info else (), ""))

    async def _failed(self, a: Action, reason: str) -> None:
        log.warning("volume %s: %s failed: %s", a.volume.id, a.kind, reason)
        await write_outcome(self.s, a, failed(a, reason))


async def write_outcome(shell: Shell, a: Action, outcome: Outcome | None, fenced: bool | str = True) -> bool:
    """Write a step's outcome over the record it was decided on (compare-and-swap: a record
    changed meanwhile is decided again) and publish its event. False: nothing was written."""
    if outcome is None:
        return False
    key = keys.volume(a.volume.id)
    op = Delete(key) if outcome.volume is None else put_doc(key, outcome.volume)
    if not await shell.state.commit([Compare(key, a.mod_revision)], [op], fenced=fenced):
        return False
    shell.emit(outcome.event, f"volume/{a.volume.id}", outcome.message, outcome.reason)
    return True
