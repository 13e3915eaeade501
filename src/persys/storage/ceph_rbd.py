"""The `ceph-rbd` driver: volumes are RBD images in one pool, handled through librbd in the caller's
thread; VMs open them through QEMU's own librbd (`VM_DISK`). A writer attach takes the image's
advisory exclusive lock with the node id as cookie (single writer); `fence` blocklists a dead
node's clients and breaks its lock (rbd_fencing). Images are made without librbd's managed
exclusive-lock feature: that feature shares the lock with advisory locks, so QEMU, trying to take
it for its first write, would wait forever behind the node's advisory lock.

Clones (from a snapshot, or from a volume through a hidden snapshot) are flattened at once, so the
parent can be deleted later whatever happens to the clone; a crash in between is finished by the
next `provision` of the clone, and `delete` of the parent flattens whatever clone is left.

With the cluster's id (security.cluster_id) a volume's image is `cluster-<id>.<volume>` (`image_name`):
two clusters sharing a pool, with volumes or nodes named alike, never open, lock, list or delete
each other's. Volume ids hold no '.', so no volume of another cluster, nor of the naming before
cluster ids (the bare volume id), can take that form. An image of the naming before cluster ids
is used under its name as long as the cluster has none of its own for that volume (adopted in
place: a rename would cut off a VM that has it open); listed, it is `legacy`.
"""

from __future__ import annotations

import time
from typing import Any

from persys.storage.base import (
    SNAPSHOT_NAME_RE,
    VOLUME_ID_RE,
    AttachKind,
    Attachment,
    Capability,
    DiskSource,
    StorageError,
    StorageUnavailable,
    Unsupported,
    VolumeBusy,
    VolumeInfo,
    VolumeNotFound,
    check_size,
    check_volume_id,
)
from persys.storage.ceph_session import CephConfig, CephSession
from persys.storage.rbd_clones import CloneSteps, check_source, hidden_snapshot
from persys.storage.rbd_fencing import Locker, plan_fence
from persys.storage.rbd_kernel import kernel_map_missing

MIB = 1024 * 1024
# How long an image that is listed but does not open may be another client's create in progress
# before it is taken for a crash's leftover (a create takes milliseconds; a busy cluster, longer).
HALF_MADE_GRACE_S = 5.0
HALF_MADE_POLL_S = 0.05


def image_name(cluster_id: str, volume_id: str) -> str:
    """The image a cluster's volume is made as ("": the naming before cluster ids)."""
    return f"cluster-{cluster_id}.{volume_id}" if cluster_id else volume_id


class CephRbdDriver:
    name = "ceph-rbd"
    node_bound = False

    def __init__(self, node_id: str, config: CephConfig, *, half_made_grace: float = HALF_MADE_GRACE_S,
                 cluster_id: str = "") -> None:
        self.node_id = node_id
        self.config = config
        self.half_made_grace = half_made_grace
        self.cluster_id = cluster_id
        self._s = CephSession(config)
        self._rbd = self._s.rbd
        self._clones = CloneSteps(self._s, self._features())

    def _features(self) -> int:
        return int(self._rbd.RBD_FEATURE_LAYERING | self._rbd.RBD_FEATURE_DEEP_FLATTEN)

    def close(self) -> None:
        self._s.close()

    # -- probing -------------------------------------------------------------------------------

    def probe(self) -> Capability:
        kernel = kernel_map_missing()
        try:
            self._s.run(lambda io: self._rbd.RBD().list(io))
        except StorageError as err:
            why = f"ceph-rbd: {err}"
            return Capability(self.name, frozenset(), {AttachKind.VM_DISK: why, AttachKind.FILESYSTEM: why})
        return Capability(self.name, frozenset({AttachKind.VM_DISK}), {AttachKind.FILESYSTEM: kernel}, block=True)

    # -- images ----------------------------------------------------------------------------------

    def _name(self, io: Any, volume_id: str) -> str:
        """The volume's image: the cluster's name, or the one from before cluster ids when only
        that exists (adopted in place)."""
        name = image_name(self.cluster_id, volume_id)
        if name != volume_id and not self._exists(io, name) and self._exists(io, volume_id):
            return volume_id
        return name

    def _volume_of(self, name: str) -> tuple[str, bool] | None:
        """(volume id, from before cluster ids) of an image in the pool; None: another cluster's."""
        prefix = image_name(self.cluster_id, "")
        if prefix and name.startswith(prefix):
            return name[len(prefix):], False
        if VOLUME_ID_RE.fullmatch(name):
            return name, bool(self.cluster_id)
        return None

    def _open(self, io: Any, volume_id: str, *, read_only: bool = True) -> Any:
        try:
            return self._rbd.Image(io, self._name(io, volume_id), read_only=read_only)
        except self._rbd.ImageNotFound as err:
            raise VolumeNotFound(f"volume {volume_id!r} does not exist in pool {self.config.pool!r}") from err

    def _info(self, io: Any, volume_id: str) -> VolumeInfo:
        with self._open(io, volume_id) as img:
            snaps = tuple(s["name"] for s in img.list_snaps() if not hidden_snapshot(s["name"]))
            return VolumeInfo(volume_id, int(img.size()) // MIB, snaps)

    def info(self, volume_id: str) -> VolumeInfo:
        check_volume_id(volume_id)
        return self._s.run(lambda io: self._info(io, volume_id))

    def provision(self, volume_id: str, size_mb: int, *, source: tuple[str, str] | None = None) -> VolumeInfo:
        check_volume_id(volume_id)
        check_size(size_mb)
        parent = check_source(source) if source is not None else None

        def call(io: Any) -> VolumeInfo:
            name = self._name(io, volume_id)
            source = (self._name(io, parent[0]), parent[1]) if parent is not None else None
            if self._exists(io, name):
                # A clone a crash interrupted is finished; anything else is returned unchanged.
                self._clones.finish(io, name, size_mb * MIB, source)
                return self._info(io, volume_id)
            if source is None:
                self._create(io, name, size_mb * MIB)
            else:
                self._clones.clone(io, name, size_mb * MIB, source)
            return self._info(io, volume_id)
        return self._s.run(call)

    def _create(self, io: Any, name: str, size: int) -> None:
        for _ in (1, 2):
            try:
                self._rbd.RBD().create(io, name, size, old_format=False, features=self._features())
                return
            except self._rbd.ImageExists:
                if self._opens_soon(io, name):
                    return  # a concurrent create made it (the controller and the node both provision)
                # Listed but never openable: what a crash inside librbd's create leaves. Start over.
                self._clones.remove_leftover(io, name)
        raise StorageError(f"volume image {name!r}: a half-made image could not be replaced")

    def _opens_soon(self, io: Any, volume_id: str) -> bool:
        """Whether an image listed under this name opens within the grace. librbd lists a new
        image before it writes its header: one being created elsewhere opens within milliseconds,
        and removing it then would break that create; what a crashed create left never opens."""
        deadline = time.monotonic() + self.half_made_grace
        while not self._exists(io, volume_id):
            if time.monotonic() >= deadline:
                return False
            time.sleep(HALF_MADE_POLL_S)
        return True

    def _exists(self, io: Any, volume_id: str) -> bool:
        try:
            self._rbd.Image(io, volume_id, read_only=True).close()
        except self._rbd.ImageNotFound:
            return False
        return True

    def resize(self, volume_id: str, size_mb: int) -> VolumeInfo:
        check_volume_id(volume_id)
        check_size(size_mb)

        def call(io: Any) -> VolumeInfo:
            with self._open(io, volume_id, read_only=False) as img:
                current = int(img.size())
                if size_mb * MIB < current:
                    raise Unsupported(f"size: {size_mb} MiB is below the volume's {current // MIB} MiB "
                                      "(RBD volumes only grow)")
                if size_mb * MIB > current:
                    img.resize(size_mb * MIB)  # QEMU with the image open is told by librbd
            return self._info(io, volume_id)
        return self._s.run(call)

    def snapshot(self, volume_id: str, snap: str) -> None:
        check_volume_id(volume_id)
        _check_snap(snap)

        def call(io: Any) -> None:
            with self._open(io, volume_id, read_only=False) as img:
                if snap not in {s["name"] for s in img.list_snaps()}:
                    try:
                        img.create_snap(snap)
                    except self._rbd.ImageExists:
                        pass
        self._s.run(call)

    def delete_snapshot(self, volume_id: str, snap: str) -> None:
        check_volume_id(volume_id)
        _check_snap(snap)
        self._s.run(lambda io: self._clones.remove_snapshot(io, self._name(io, volume_id), snap))

    # -- attachments -----------------------------------------------------------------------------

    def _disk(self, name: str) -> DiskSource:
        c = self.config
        return DiskSource("rbd", f"{c.pool}/{name}", hosts=c.monitors, user=c.user,
                          secret_name=c.secret_name, conf=c.conf_path)

    def _attachment(self, volume_id: str, read_only: bool, name: str) -> Attachment:
        """`name`: the volume's image (what QEMU opens)."""
        return Attachment(volume_id, self.node_id, AttachKind.VM_DISK, read_only, disk=self._disk(name),
                          legacy=name == volume_id and bool(self.cluster_id))

    def _lockers(self, img: Any) -> list[Locker]:
        found = img.list_lockers()  # [] when unlocked, else {"tag", "exclusive", "lockers"}
        return [Locker(str(c), str(k), str(a)) for c, k, a in (found["lockers"] if found else [])]

    def attach(self, volume_id: str, kind: AttachKind, *, read_only: bool = False) -> Attachment:
        check_volume_id(volume_id)
        if kind is not AttachKind.VM_DISK:
            raise Unsupported(f"kind: {kind.value} needs a kernel RBD map on the node: {kernel_map_missing()}")

        def call(io: Any) -> Attachment:
            with self._open(io, volume_id) as img:
                if not read_only:
                    self._lock(img, volume_id)
            return self._attachment(volume_id, read_only, self._name(io, volume_id))
        return self._s.run(call)

    def _lock(self, img: Any, volume_id: str) -> None:
        for _ in (1, 2):
            lockers = self._lockers(img)
            if any(lk.cookie == self.node_id for lk in lockers):
                return  # ours already (perhaps from an earlier connection of this node)
            if lockers:
                holders = ", ".join(sorted({lk.cookie for lk in lockers}))
                raise VolumeBusy(f"volume {volume_id!r} is attached for writing on node {holders}; "
                                 "fence that node first if it is dead")
            try:
                img.lock_exclusive(self.node_id)
                return
            except (self._rbd.ImageBusy, self._rbd.ImageExists):
                continue  # someone took it between the look and the lock: look again
        raise VolumeBusy(f"volume {volume_id!r}: its lock keeps changing hands")

    def detach(self, volume_id: str) -> None:
        check_volume_id(volume_id)

        def call(io: Any) -> None:
            try:
                img = self._rbd.Image(io, self._name(io, volume_id), read_only=True)
            except self._rbd.ImageNotFound:
                return
            with img:
                me = self._s.instance()
                for lk in self._lockers(img):
                    if lk.cookie != self.node_id:
                        continue
                    try:
                        if lk.client == me:
                            img.unlock(lk.cookie)
                        else:  # taken by an earlier connection of this node (an agent restart)
                            img.break_lock(lk.client, lk.cookie)
                    except self._rbd.ImageNotFound:
                        pass  # released or broken meanwhile
        self._s.run(call)

    def fence(self, volume_id: str, node_id: str) -> None:
        check_volume_id(volume_id)
        if not node_id or node_id == self.node_id:
            raise StorageError(f"node_id: fence another node, not {node_id!r} (this node detaches)")

        def call(io: Any) -> None:
            try:
                img = self._rbd.Image(io, self._name(io, volume_id), read_only=True)
            except self._rbd.ImageNotFound:
                return
            with img:
                watchers = [str(w["addr"]) for w in img.watchers_list()]
                plan = plan_fence(self._lockers(img), watchers, node_id, self._s.addresses())
                # Blocklist first, then break: a retry after a crash in between finds the lock
                # still there and blocklists again (adding an entry twice is harmless).
                for addr in plan.blocklist:
                    self._s.mon_command({"prefix": "osd blocklist", "blocklistop": "add", "addr": addr,
                                         "expire": float(self.config.blocklist_expire_s)})
                for lk in plan.break_locks:
                    try:
                        img.break_lock(lk.client, lk.cookie)
                    except self._rbd.ImageNotFound:
                        pass
        self._s.run(call)

    def attached(self) -> list[Attachment]:
        def call(io: Any) -> list[Attachment]:
            found: dict[str, Attachment] = {}
            named = [(name, self._volume_of(name)) for name in self._rbd.RBD().list(io)]
            # The cluster's own images first: a volume found under both names is its own.
            for name, vol in sorted((n, v) for n, v in named if v is not None and not v[1]) + \
                    sorted((n, v) for n, v in named if v is not None and v[1]):
                if vol[0] in found:
                    continue
                try:
                    with self._rbd.Image(io, name, read_only=True) as img:
                        if any(lk.cookie == self.node_id for lk in self._lockers(img)):
                            found[vol[0]] = self._attachment(vol[0], False, name)
                except self._rbd.ImageNotFound:
                    continue  # deleted while listing
            return [found[k] for k in sorted(found)]
        return self._s.run(call)

    def delete(self, volume_id: str) -> None:
        check_volume_id(volume_id)

        def call(io: Any) -> None:
            name = self._name(io, volume_id)
            try:
                img = self._rbd.Image(io, name, read_only=True)
            except self._rbd.ImageNotFound:
                self._clones.remove_leftover(io, name)  # a half-made or half-removed image
                return
            with img:
                lockers = self._lockers(img)
                watchers = [str(w["addr"]) for w in img.watchers_list()]
            if lockers:
                nodes = ", ".join(sorted({lk.cookie for lk in lockers}))
                raise VolumeBusy(f"volume {volume_id!r} is attached on node {nodes}: detach it first")
            if watchers:
                raise VolumeBusy(f"volume {volume_id!r} is open by {len(watchers)} client(s) "
                                 f"({', '.join(watchers)}): a VM still running?")
            self._clones.remove_image(io, name)
        self._s.run(call)


def _check_snap(snap: str) -> None:
    if not SNAPSHOT_NAME_RE.fullmatch(snap):
        raise StorageError(f"snapshot name {snap!r} is not a DNS label (lowercase letters, digits, '-')")


__all__ = ["CephConfig", "CephRbdDriver", "StorageUnavailable"]
