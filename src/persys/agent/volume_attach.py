"""Getting an instance's volumes ready on this node just before it starts, and letting them go
when it is removed: provision where missing (idempotent), attach as the runtime needs them
(a mounted directory for containers, processes and compose; a disk QEMU opens for VMs), through
the node's storage drivers (persys.storage). Driver calls block: they run in threads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.runtimes.base import RuntimeFailure, VolumeMount
from persys.model.volume import inline_volume_id
from persys.model.workload import VolumeSpec, WorkloadSpec, workload_of
from persys.storage.base import (
    AttachKind,
    Attachment,
    DiskKeyed,
    StorageError,
    StorageUnavailable,
    Unsupported,
    VolumeBusy,
    VolumeDriver,
    VolumeNotFound,
)

log = logging.getLogger(__name__)
VM_TYPES = ("vm", "microvm")


def attach_kind(workload_type: str) -> AttachKind:
    return AttachKind.VM_DISK if workload_type in VM_TYPES else AttachKind.FILESYSTEM


def volume_id_of(instance: str, name: str, claim: str | None) -> str:
    return claim if claim is not None else inline_volume_id(workload_of(instance), name)


@dataclass(frozen=True, slots=True)
class Held:
    driver: str
    kind: AttachKind
    read_only: bool
    size_mb: int


def _source(v: VolumeSpec) -> tuple[str, str] | None:
    """A claimed clone's source as the drivers take it ("snapshot", "<vol>@<snap>") or
    ("volume", "<vol>"); None for a volume that starts empty."""
    if v.source is None:
        return None
    kind, _, ref = v.source.partition(":")
    return kind, ref


class VolumeAttacher:
    def __init__(self, drivers: Mapping[str, VolumeDriver]) -> None:
        self.drivers = dict(drivers)
        self._held: dict[str, set[str]] = {}  # volume id -> instances on this node using it
        self._how: dict[str, Held] = {}  # volume id -> how it is attached (what reports say)
        self._specs: dict[str, WorkloadSpec] = {}  # instance -> the spec its volumes were attached for
        self._lock = asyncio.Lock()  # one attach/detach at a time: drivers' steps are not reentrant

    def _driver(self, name: str) -> VolumeDriver:
        d = self.drivers.get(name)
        if d is None:
            raise RuntimeFailure(f"volume driver {name} is not configured on this node (persys agent --storage)",
                                 code="VolumeUnavailable", terminal=False)
        return d

    async def prepare(self, instance: str, spec: WorkloadSpec, fence_node: str = "") -> tuple[VolumeMount, ...]:
        """Provision and attach every volume of `instance`; RuntimeFailure (VolumeUnavailable,
        VolumeBusy: retried with backoff) naming the volume when one cannot be had. `fence_node`:
        a node the scheduler found lost after it ran this instance; a writer attach that finds
        the volume held there fences that node first (never two writers: the lost node's
        clients are cut off before this one writes)."""
        mounts = []
        kind = attach_kind(spec.type)
        async with self._lock:
            # Recorded first: a start that fails half way still has its attachments let go when
            # the instance is removed (attach is idempotent, so a retry reuses them).
            self._specs[instance] = spec
            for v in spec.volumes:
                # A claim arrives with its Volume's driver and size (scheduler.delivery.resolved_claims).
                vid = volume_id_of(instance, v.name, v.claim)
                driver = self._driver(v.driver)
                try:
                    info = await asyncio.to_thread(driver.provision, vid, max(v.size_mb, 1), source=_source(v))
                    att = await self._attach(driver, vid, kind, v.read_only, fence_node)
                except VolumeBusy as err:
                    raise RuntimeFailure(f"volume {v.name} ({vid}): {err}", code="VolumeBusy") from None
                except (StorageUnavailable, Unsupported, StorageError) as err:
                    terminal = isinstance(err, Unsupported)
                    raise RuntimeFailure(f"volume {v.name} ({vid}): {err}", code="VolumeUnavailable",
                                         terminal=terminal) from None
                self._held.setdefault(vid, set()).add(instance)
                self._how[vid] = Held(driver.name, kind, v.read_only, info.size_mb)
                key = driver.disk_key() if kind is AttachKind.VM_DISK and isinstance(driver, DiskKeyed) else ""
                mounts.append(VolumeMount(v.name, v.mount_path, v.read_only, att, key))
        return tuple(mounts)

    async def _attach(self, driver: VolumeDriver, vid: str, kind: AttachKind, read_only: bool,
                      fence_node: str) -> Attachment:
        try:
            return await asyncio.to_thread(driver.attach, vid, kind, read_only=read_only)
        except VolumeBusy:
            if read_only or not fence_node or fence_node == driver.node_id:
                raise
        log.warning("volume %s is held by lost node %s: fencing it before attaching here", vid, fence_node)
        await asyncio.to_thread(driver.fence, vid, fence_node)
        return await asyncio.to_thread(driver.attach, vid, kind, read_only=read_only)

    async def release(self, instance: str) -> None:
        """Detach what `instance` used once no other instance here uses it. Failures are logged
        and left for the next sweep (`sweep`): a removal never waits on storage."""
        spec = self._specs.pop(instance, None)
        if spec is None:
            return
        async with self._lock:
            for v in spec.volumes:
                vid = volume_id_of(instance, v.name, v.claim)
                users = self._held.get(vid, set())
                users.discard(instance)
                if users:
                    continue
                self._held.pop(vid, None)
                self._how.pop(vid, None)
                driver = self.drivers.get(v.driver)
                if driver is None:
                    continue
                try:
                    await asyncio.to_thread(driver.detach, vid)
                except StorageError as err:
                    log.warning("detaching volume %s of %s failed (retried by the next sweep): %s", vid, instance, err)

    async def sweep(self, wanted: Mapping[str, WorkloadSpec]) -> list[str]:
        """After a restart, with what the drivers find on the node (nothing is in memory): adopt
        the attachments wanted instances use (an adopted running instance is never prepared
        again, yet its volumes are held: reported, kept from deletion, released with it), and
        detach the rest. Returns the volume ids detached."""
        users: dict[str, list[tuple[str, WorkloadSpec]]] = {}
        for instance, spec in wanted.items():
            for v in spec.volumes:
                users.setdefault(volume_id_of(instance, v.name, v.claim), []).append((instance, spec))
        done = []
        async with self._lock:
            for driver in self.drivers.values():
                try:
                    attached = await asyncio.to_thread(driver.attached)
                except StorageError as err:
                    log.warning("listing %s attachments failed: %s", driver.name, err)
                    continue
                for att in attached:
                    if att.volume_id in self._held:
                        continue
                    if att.volume_id in users:
                        await self._adopt(driver, att, users[att.volume_id])
                        continue
                    if att.legacy:  # from before cluster ids: maybe another cluster's, left alone
                        log.info("volume %s attached in the layout before cluster ids: left alone", att.volume_id)
                        continue
                    try:
                        await asyncio.to_thread(driver.detach, att.volume_id)
                        done.append(att.volume_id)
                    except StorageError as err:
                        log.warning("detaching leftover volume %s failed: %s", att.volume_id, err)
        return done

    async def _adopt(self, driver: VolumeDriver, att: Attachment, users: list[tuple[str, WorkloadSpec]]) -> None:
        try:
            size = (await asyncio.to_thread(driver.info, att.volume_id)).size_mb
        except StorageError:
            size = 0  # unknown until the next attach: the report says 0, the record keeps its size
        for instance, spec in users:
            self._specs.setdefault(instance, spec)
            self._held.setdefault(att.volume_id, set()).add(instance)
        self._how[att.volume_id] = Held(driver.name, att.kind, att.read_only, size)

    def holds(self, volume_id: str) -> bool:
        return bool(self._held.get(volume_id))

    def attached(self) -> list[pb.NodeVolume]:
        """What instances here hold attached now (the report's volume list)."""
        return [pb.NodeVolume(volume_id=vid, driver=h.driver, kind=str(h.kind), read_only=h.read_only,
                              instances=sorted(self._held.get(vid, ())), size_mb=h.size_mb)
                for vid, h in sorted(self._how.items())]

    async def carry_out(self, task: pb.VolumeTask) -> pb.VolumeTaskResult:
        """One step the scheduler asks of this node on a local volume (delete, resize, snapshot,
        unsnapshot); idempotent, like the driver calls it makes. Never raises: the result says."""
        out = pb.VolumeTaskResult(volume_id=task.volume_id, op=task.op, snapshot=task.snapshot)
        driver = self.drivers.get(task.driver)
        if driver is None:
            out.reason = f"volume driver {task.driver} is not configured on this node"
            return out
        vid = task.volume_id
        async with self._lock:
            try:
                if task.op == "delete":
                    if self.holds(vid):
                        raise VolumeBusy(f"in use here by {', '.join(sorted(self._held[vid]))}")
                    await asyncio.to_thread(driver.detach, vid)  # a leftover no instance holds
                    await asyncio.to_thread(driver.delete, vid)
                    out.ok = True
                    return out
                if task.op == "resize":
                    info = await asyncio.to_thread(driver.resize, vid, task.size_mb)
                    if vid in self._how:
                        self._how[vid] = replace(self._how[vid], size_mb=info.size_mb)
                elif task.op in ("snapshot", "unsnapshot"):
                    step = driver.snapshot if task.op == "snapshot" else driver.delete_snapshot
                    await asyncio.to_thread(step, vid, task.snapshot)
                    info = await asyncio.to_thread(driver.info, vid)
                else:
                    out.reason = f"unknown volume step {task.op[:40]!r}"
                    return out
            except VolumeNotFound as err:
                if task.op == "delete":
                    out.ok = True  # already gone
                    return out
                out.reason = str(err)
                return out
            except StorageError as err:
                out.reason = str(err)
                return out
        out.ok, out.size_mb = True, info.size_mb
        out.snapshots.extend(info.snapshots)
        return out
