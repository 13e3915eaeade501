"""The volume controller: on the active replica, carries network volumes' records (nfs, ceph-rbd:
reachable from the control plane, unlike a node's local disk) to their backend. A Pending
volume is provisioned (cloned from its source where it has one), a grown one resized, a
Deleting one removed with its record. Decisions are pure (`actions`); each step is idempotent,
so a replica that dies mid-way leaves work the next active replica finishes. Local volumes are
provisioned by their node's agent at first attach.

A failed step marks the record Failed with the driver's reason (shown by `describe volume`) and
is retried after a pause; writes are fenced by the leader key, so a deposed replica writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from persys.model.volume import Volume, VolumePhase
from persys.scheduler import keys
from persys.scheduler.shell import Shell
from persys.scheduler.state import Versioned, put_doc
from persys.storage.base import StorageError, VolumeDriver, VolumeInfo
from persys.store.base import Compare, Delete

log = logging.getLogger(__name__)
RETRY_S = 10.0  # a failed step waits this long before it is tried again
IDLE_S = 30.0  # with nothing to do, look again this often (changes wake it at once)


@dataclass(frozen=True, slots=True)
class Action:
    kind: Literal["provision", "resize", "delete", "snapshot", "unsnapshot"]
    volume: Volume
    mod_revision: int
    snapshot: str = ""


def actions(volumes: Mapping[str, Versioned[Volume]], drivers: Collection[str],
            not_before: Mapping[str, float], now: float) -> list[Action]:
    """What to do now for the volumes whose driver this controller has (pure)."""
    out = []
    for vid, cur in sorted(volumes.items()):
        v = cur.value
        if v.spec.driver == "local" or v.spec.driver not in drivers or not_before.get(vid, 0.0) > now:
            continue
        if v.phase == VolumePhase.DELETING:
            out.append(Action("delete", v, cur.mod_revision))
        elif v.provisioned_mb == 0 and v.phase in (VolumePhase.PENDING, VolumePhase.FAILED):
            out.append(Action("provision", v, cur.mod_revision))
        elif 0 < v.provisioned_mb < v.spec.size_mb:
            out.append(Action("resize", v, cur.mod_revision))
        elif v.provisioned_mb and (todo := _snapshot_step(v, cur.mod_revision)) is not None:
            out.append(todo)
    return out


def _snapshot_step(v: Volume, rev: int) -> Action | None:
    """The first snapshot to make or remove so the backend's follow the wanted ones."""
    for snap in v.wanted_snapshots:
        if snap not in v.snapshots:
            return Action("snapshot", v, rev, snap)
    for snap in v.snapshots:
        if snap not in v.wanted_snapshots:
            return Action("unsnapshot", v, rev, snap)
    return None


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
        v, key = a.volume, keys.volume(a.volume.id)
        if info is None:
            if await self.s.state.commit([Compare(key, a.mod_revision)], [Delete(key)]):
                self.s.emit("VolumeDeleted", f"volume/{v.id}", f"{v.spec.driver} data removed")
            return
        updated = v.model_copy(update={"phase": VolumePhase.AVAILABLE, "provisioned_mb": info.size_mb,
                                       "snapshots": list(info.snapshots), "reason": "", "updated_at": time.time()})
        if await self.s.state.commit([Compare(key, a.mod_revision)], [put_doc(key, updated)]):
            kind, what = {"provision": ("VolumeProvisioned", f"{info.size_mb} MiB on {v.spec.driver}"),
                          "resize": ("VolumeResized", f"{info.size_mb} MiB"),
                          "snapshot": ("VolumeSnapshotted", f"snapshot {a.snapshot}"),
                          "unsnapshot": ("VolumeSnapshotDeleted", f"snapshot {a.snapshot}")}[a.kind]
            self.s.emit(kind, f"volume/{v.id}", what)

    async def _failed(self, a: Action, reason: str) -> None:
        v, key = a.volume, keys.volume(a.volume.id)
        log.warning("volume %s: %s failed: %s", v.id, a.kind, reason)
        if v.phase == VolumePhase.FAILED and v.reason == reason[:1024]:
            return
        phase = VolumePhase.DELETING if a.kind == "delete" else VolumePhase.FAILED  # a delete is retried as one
        updated = v.model_copy(update={"phase": phase, "reason": reason[:1024], "updated_at": time.time()})
        if await self.s.state.commit([Compare(key, a.mod_revision)], [put_doc(key, updated)]):
            self.s.emit("VolumeFailed", f"volume/{v.id}", f"{a.kind}: {reason[:300]}", reason="VolumeFailed")
