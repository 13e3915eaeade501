"""The `local` driver: each volume is a sparse ext4 image in a pool folder of the node, its size
enforced by the image (writing past it fails with ENOSPC).

    <pool>/images/<id>.img              the volume (0600; the folders 0700)
    <pool>/snapshots/<id>@<snap>.img    sparse copies (reflinks where the filesystem has them)
    <pool>/mounts/<id>/                 where a FILESYSTEM attachment is loop-mounted
    <pool>/attach/<id>.vm-disk          a VM_DISK attachment (QEMU opens the image itself)
    <pool>/.probe/                      the probe's tiny image and mount point

With the cluster's id (security.cluster_id), <pool> above is `<pool>/cluster-<id>/`: the images,
hence the loop devices bound to them (`losetup -l` shows the backing file), and the mount points
carry it, and two clusters given the same pool never list, sweep or detach each other's. A volume
of the layout before cluster ids (`<pool>/images/<id>.img`) is adopted by the node it is asked of:
moved into the cluster's folder at its next provision, or used in place while it is attached;
listed, it is marked `legacy`, and the leftover sweep never detaches one (it may be another
cluster's).

What is attached is read from the kernel (mountinfo, the loop devices in sysfs) and the markers,
never from memory, so a fresh instance finds and detaches what a crashed one left (a loop device
without a mount included). The data never leaves the node: placement pins the workload
(`node_bound`).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from persys.storage import ext4_images as img
from persys.storage import node_mounts as nm
from persys.storage.base import (
    AttachKind,
    Attachment,
    Capability,
    DiskSource,
    StorageError,
    Unsupported,
    VolumeBusy,
    VolumeInfo,
    VolumeNotFound,
    check_size,
    check_snapshot_name,
    check_volume_id,
    parse_source,
)
from persys.storage.commands import CommandFailed, run
from persys.storage.local_probe import probe_pool
from persys.storage.loop_mount import mount_image


class LocalDriver:
    name = "local"
    node_bound = True
    enforces_single_writer = True  # one node only, and one attachment kind at a time

    def __init__(self, pool: str | Path, node_id: str, *, timeout: float = 60.0, copy_timeout: float = 900.0,
                 cluster_id: str = "") -> None:
        given = Path(pool).resolve()  # as mountinfo and losetup spell it (no symlinks)
        self.pool = given / f"cluster-{cluster_id}" if cluster_id else given
        self.legacy: Path | None = given if cluster_id else None  # the layout before cluster ids
        self.node_id = node_id
        self.timeout = timeout
        self.copy_timeout = copy_timeout
        self.images = self.pool / "images"
        self.snapshots = self.pool / "snapshots"
        self.mounts = self.pool / "mounts"
        self.markers = self.pool / "attach"

    # -- paths and state read from the node ------------------------------------------------------

    def _layout(self) -> None:
        # The pool given, then the cluster's folder in it: a workload's user passes through both.
        for d in (*([self.legacy] if self.legacy is not None else []), self.pool, self.images, self.mounts):
            img.ensure_dir(d, img.TRAVERSE_MODE)
        for d in (self.snapshots, self.markers):
            img.ensure_dir(d)

    def _root(self, volume_id: str) -> Path:
        """The pool folder the volume lives in: the cluster's, or the layout before cluster ids
        for a volume found only there (adopted in place until its next provision moves it)."""
        if (self.legacy is not None and not (self.pool / "images" / f"{volume_id}.img").exists()
                and (self.legacy / "images" / f"{volume_id}.img").exists()):
            return self.legacy
        return self.pool

    def image(self, volume_id: str) -> Path:
        return self._root(volume_id) / "images" / f"{volume_id}.img"

    def _snap(self, volume_id: str, snap: str) -> Path:
        return self._root(volume_id) / "snapshots" / f"{volume_id}@{snap}.img"

    def _marker(self, volume_id: str) -> Path:
        return self._root(volume_id) / "attach" / f"{volume_id}.vm-disk"

    def _mp(self, volume_id: str) -> Path:
        return self._root(volume_id) / "mounts" / volume_id

    def _adopt(self, volume_id: str) -> None:
        """Move a volume of the layout before cluster ids, with its snapshots, into the cluster's
        folder, unless it is attached there now (then it is used in place). A rename: the data
        does not move."""
        old = self.legacy
        if old is None or self._root(volume_id) != old:
            return
        if (nm.mount_at(old / "mounts" / volume_id) is not None or self._loops(volume_id)
                or self._vm_disk_marker(volume_id) is not None):
            return
        self._layout()
        for snap in sorted((old / "snapshots").glob(f"{volume_id}@*.img")):
            snap.rename(self.snapshots / snap.name)
        (old / "images" / f"{volume_id}.img").rename(self.images / f"{volume_id}.img")  # (image() says old)
        with contextlib.suppress(OSError):
            (old / "mounts" / volume_id).rmdir()

    def _existing(self, volume_id: str) -> Path:
        check_volume_id(volume_id)
        path = self.image(volume_id)
        if not path.is_file():
            raise VolumeNotFound(f"local volume {volume_id} not found on node {self.node_id} ({path})")
        return path

    def _loops(self, volume_id: str) -> list[nm.LoopDevice]:
        return nm.loops_backed_by({str(self.image(volume_id))}, self.timeout)

    def _vm_disk_marker(self, volume_id: str) -> bool | None:
        """None: not attached as a VM disk; else whether it is read-only."""
        try:
            return bool(json.loads(self._marker(volume_id).read_text())["readOnly"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return False  # unreadable (a torn write): treat as a writer, the safe reading

    def _info(self, volume_id: str, path: Path) -> VolumeInfo:
        prefix = f"{volume_id}@"
        snapshots = path.parent.parent / "snapshots"  # the volume's own root (legacy in place or the cluster's)
        snaps = sorted(p.name[len(prefix):-4] for p in snapshots.glob(f"{volume_id}@*.img"))
        return VolumeInfo(volume_id, img.size_mb(path), tuple(snaps))

    # -- VolumeDriver ----------------------------------------------------------------------------

    def probe(self) -> Capability:
        return probe_pool(self.name, self.pool, self.timeout)

    def provision(self, volume_id: str, size_mb: int, *, source: tuple[str, str] | None = None) -> VolumeInfo:
        check_volume_id(volume_id)
        check_size(size_mb)
        if source is not None:
            parse_source(source)  # bad input is refused even when the volume exists
        self._adopt(volume_id)
        final = self.image(volume_id)
        if final.is_file():  # before the source: a retry converges after the source is gone
            return self._info(volume_id, final)
        origin = self._source_path(source) if source is not None else None
        self._layout()
        if origin is None:
            img.create_formatted(final, size_mb, self.timeout)
            return self._info(volume_id, final)
        have = img.size_mb(origin)
        if size_mb < have:
            raise Unsupported(f"size {size_mb} MiB is smaller than the source's {have} MiB (volumes never shrink)")
        tmp = img.tmp_of(final)
        img.copy_sparse(origin, tmp, self.copy_timeout)  # built as <id>.img.tmp.tmp, then <id>.img.tmp
        try:
            if size_mb > have:
                img.grow_file(tmp, size_mb)
                img.grow_offline(tmp, self.timeout)
            img.publish(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return self._info(volume_id, final)

    def _source_path(self, source: tuple[str, str]) -> Path:
        vol, snap = parse_source(source)
        if snap is None:
            if self._mounted_rw_or_vm_writer(vol):
                raise VolumeBusy(f"source volume {vol} is attached for writing: detach it (or clone a snapshot)")
            return self._existing(vol)
        path = self._snap(vol, snap)
        if not path.is_file():
            raise VolumeNotFound(f"snapshot {vol}@{snap} not found on node {self.node_id}")
        return path

    def _mounted_rw_or_vm_writer(self, volume_id: str) -> bool:
        m = nm.mount_at(self._mp(volume_id))
        return (m is not None and not m.read_only) or self._vm_disk_marker(volume_id) is False

    def info(self, volume_id: str) -> VolumeInfo:
        return self._info(volume_id, self._existing(volume_id))

    def resize(self, volume_id: str, size_mb: int) -> VolumeInfo:
        path = self._existing(volume_id)
        check_size(size_mb)
        have = img.size_mb(path)
        if size_mb < have:
            raise Unsupported(f"size {size_mb} MiB is smaller than {have} MiB: local volumes never shrink")
        if self._vm_disk_marker(volume_id) is not None:
            raise VolumeBusy(f"volume {volume_id} is attached as a VM disk: detach it to resize")
        mount = nm.mount_at(self._mp(volume_id))
        if mount is not None and mount.read_only:
            raise VolumeBusy(f"volume {volume_id} is mounted read-only: detach it to resize")
        if mount is not None and size_mb > have and not img.can_grow_online():
            raise Unsupported(f"volume {volume_id} is mounted and this agent cannot grow a mounted ext4 (it lacks "
                              "CAP_SYS_RESOURCE): detach it and resize again, or give the agent that capability")
        img.grow_file(path, size_mb)
        if mount is not None:
            if img.fs_bytes(mount.source, self.timeout) < path.stat().st_size:
                img.grow_online(mount.source, self.timeout)
        elif img.fs_bytes(str(path), self.timeout) < path.stat().st_size:  # also after a crash mid-resize
            for loop in self._loops(volume_id):  # a loop device a crash left would pin the old size
                nm.free_loop(loop.name, self.timeout)
            img.grow_offline(path, self.timeout)
        return self._info(volume_id, path)

    def snapshot(self, volume_id: str, snap: str) -> None:
        path = self._existing(volume_id)
        check_snapshot_name(snap)
        target = self._snap(volume_id, snap)
        if target.is_file():
            return
        if self._vm_disk_marker(volume_id) is False:
            raise VolumeBusy(f"volume {volume_id} is attached as a writable VM disk: a copy under a running guest "
                             "is not crash-consistent; detach it (or snapshot from the stopped VM)")
        self._layout()
        mount = nm.mount_at(self._mp(volume_id))
        if mount is None or mount.read_only:
            img.copy_sparse(path, target, self.copy_timeout)
            return
        mp = str(self._mp(volume_id))
        self._thaw(mp)  # a crash during an earlier snapshot may have left it frozen
        run(["fsfreeze", "-f", mp], timeout=self.timeout)  # flushed and held still: a crash-consistent copy
        try:
            img.copy_sparse(path, target, self.copy_timeout)
        finally:
            self._thaw(mp)

    def _thaw(self, mount_point: str) -> None:
        try:
            run(["fsfreeze", "-u", mount_point], timeout=self.timeout)
        except CommandFailed as e:
            if "Invalid argument" not in e.output:  # EINVAL: it was not frozen
                raise

    def delete_snapshot(self, volume_id: str, snap: str) -> None:
        check_volume_id(volume_id)
        check_snapshot_name(snap)
        target = self._snap(volume_id, snap)
        img.tmp_of(target).unlink(missing_ok=True)
        target.unlink(missing_ok=True)

    def attach(self, volume_id: str, kind: AttachKind, *, read_only: bool = False) -> Attachment:
        path = self._existing(volume_id)
        kind = AttachKind(kind)
        if kind is AttachKind.VM_DISK:
            return self._attach_vm_disk(volume_id, path, read_only)
        if self._vm_disk_marker(volume_id) is not None:
            raise VolumeBusy(f"volume {volume_id} is attached as a VM disk: detach it before mounting it")
        mp = self._mp(volume_id)
        att = Attachment(volume_id, self.node_id, kind, read_only, mount_path=str(mp), legacy=self._is_legacy(mp))
        self._layout()  # also for a mount found in place: its workload's user must reach it
        mount = nm.mount_at(mp)
        if mount is not None:
            if mount.read_only != read_only:
                raise VolumeBusy(f"volume {volume_id} is mounted {'read-only' if mount.read_only else 'read-write'}: "
                                 "detach it first")
            return att
        for loop in self._loops(volume_id):  # left by a crash between loop setup and mount
            nm.free_loop(loop.name, self.timeout)
        img.ensure_dir(mp)
        try:
            mount_image(path, mp, read_only=read_only, timeout=self.timeout)
        except StorageError:
            for loop in self._loops(volume_id):
                nm.free_loop(loop.name, self.timeout)
            with contextlib.suppress(OSError):
                mp.rmdir()
            raise
        return att

    def _attach_vm_disk(self, volume_id: str, path: Path, read_only: bool) -> Attachment:
        if nm.mount_at(self._mp(volume_id)) is not None or self._loops(volume_id):
            raise VolumeBusy(f"volume {volume_id} is loop-mounted as a filesystem: detach it before a VM opens it")
        att = Attachment(volume_id, self.node_id, AttachKind.VM_DISK, read_only, disk=DiskSource("file", str(path)),
                         legacy=self._is_legacy(path))
        held = self._vm_disk_marker(volume_id)
        if held is not None:
            if held != read_only:
                raise VolumeBusy(f"volume {volume_id} is attached as a {'read-only' if held else 'writable'} VM disk: "
                                 "detach it first")
            return att
        self._layout()
        marker = self._marker(volume_id)
        tmp = img.fresh_tmp(marker)
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, img.FILE_MODE)
        with os.fdopen(fd, "w") as f:
            json.dump({"readOnly": read_only}, f)
        img.publish(tmp, marker)
        return att

    def detach(self, volume_id: str) -> None:
        check_volume_id(volume_id)
        mp = self._mp(volume_id)
        if nm.mount_at(mp) is not None:
            self._thaw(str(mp))  # a frozen filesystem would hang the unmount
            nm.unmount(mp, self.timeout)
        for loop in self._loops(volume_id):  # `mount -o loop` frees its device; a crash's leftovers not
            nm.free_loop(loop.name, self.timeout)
        with contextlib.suppress(FileNotFoundError):
            mp.rmdir()
        self._marker(volume_id).unlink(missing_ok=True)
        img.tmp_of(self._marker(volume_id)).unlink(missing_ok=True)

    def fence(self, volume_id: str, node_id: str) -> None:
        """Nothing to do: the data is on this node's disk and no other node can reach it."""
        check_volume_id(volume_id)

    def _is_legacy(self, path: Path) -> bool:
        return self.legacy is not None and not path.is_relative_to(self.pool)

    def attached(self) -> list[Attachment]:
        found: dict[str, Attachment] = {}
        roots = [(self.pool, False)] + ([(self.legacy, True)] if self.legacy is not None else [])
        loops = nm.loop_devices(self.timeout) if any(root.is_dir() for root, _ in roots) else []
        for root, legacy in roots:  # the cluster's own first: a name found in both is its
            if not root.is_dir():
                continue
            for m in nm.mounts_under(root / "mounts"):
                vid = os.path.basename(m.mount_point)
                found.setdefault(vid, Attachment(vid, self.node_id, AttachKind.FILESYSTEM, m.read_only,
                                                 mount_path=m.mount_point, legacy=legacy))
            for loop in loops:
                back = Path(loop.back_file)
                if back.parent == root / "images" and back.name.endswith(".img") and back.stem not in found:
                    vid = back.stem  # loop device without its mount: a crash between the two steps
                    found[vid] = Attachment(vid, self.node_id, AttachKind.FILESYSTEM, loop.read_only,
                                            mount_path=str(root / "mounts" / vid), legacy=legacy)
            for marker in (root / "attach").glob("*.vm-disk"):
                vid = marker.name.removesuffix(".vm-disk")
                ro = self._vm_disk_marker(vid)
                if ro is not None and vid not in found:
                    found[vid] = Attachment(vid, self.node_id, AttachKind.VM_DISK, ro,
                                            disk=DiskSource("file", str(self.image(vid))), legacy=legacy)
        return [found[k] for k in sorted(found)]

    def delete(self, volume_id: str) -> None:
        check_volume_id(volume_id)
        if any(a.volume_id == volume_id for a in self.attached()):
            raise VolumeBusy(f"volume {volume_id} is attached on node {self.node_id}: detach it before deleting")
        root = self._root(volume_id)
        for snap in (root / "snapshots").glob(f"{volume_id}@*.img*"):
            snap.unlink(missing_ok=True)
        path = self.image(volume_id)
        for leftover in (root / "images").glob(f"{volume_id}.img.tmp*"):  # a crashed provision's
            leftover.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (root / "mounts" / volume_id).rmdir()
        if not root.is_dir():
            return
        with contextlib.suppress(StorageError, OSError):
            img.fsync_dir(root / "images")

