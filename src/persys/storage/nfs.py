"""The `nfs` driver: volumes on one configured export (layout and clients: `nfs_export`).

VM disks go through QEMU's own NFS client (no kernel support needed on the node). Filesystem
attachments need a kernel NFS client (`mount -t nfs4` of the volume's folder); nodes without
one are told so by the probe, and attach refuses with the same reason. Several nodes may attach
a volume for writing (`enforces_single_writer = False`): the control plane decides by the
volume's access mode. Every step is idempotent: images are built under a name of their own per
client (`nfs_export.tmp`) and published by a hard link, which fails rather than replace one
another client published meanwhile; attachments are marker files on the export plus, for
filesystems, a mount read from the kernel.

With the cluster's id (security.cluster_id) the cluster's volumes and markers live in its own
folder on the export (`nfs_export.Layout`) and its nodes mount them under `<mountRoot>/cluster-<id>/`:
two clusters sharing an export or a host, with volumes or nodes named alike, never read, list,
detach or delete each other's. A volume from before cluster ids (straight under `/persys/`) is
used where it is: its files stay there, attachments of it are marked there, and listed it is
`legacy` (never swept as a leftover: it may be another cluster's).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from persys.storage import ext4_images as img
from persys.storage import libnfs
from persys.storage import nfs_export as ex
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
from persys.storage.commands import run
from persys.storage.nfs_probe import ProbeTarget, kernel_client_missing, probe_export

MIB = 1024 * 1024


class NfsDriver:
    name = "nfs"
    node_bound = False
    enforces_single_writer = False

    def __init__(self, export: ex.NfsExport, node_id: str, *, mount_root: str | Path, timeout: float = 30.0,
                 copy_timeout: float = 900.0, cluster_id: str = "") -> None:
        self.export = export
        self.node_id = node_id
        given = Path(mount_root).resolve()  # node-local kernel mounts, as mountinfo spells them
        self.mount_root = given / f"cluster-{cluster_id}" if cluster_id else given
        self.legacy_mounts: Path | None = given if cluster_id else None  # where mounts were before cluster ids
        self.layout = ex.Layout.of(cluster_id)
        self.legacy: ex.Layout | None = ex.Layout() if cluster_id else None
        self.timeout = timeout
        self.copy_timeout = copy_timeout
        self._holder = ex.holder_tag(node_id, uuid.uuid4().hex[:8])

    @contextmanager
    def _nfs(self) -> Iterator[libnfs.NfsSession]:
        with libnfs.session(self.export.libnfs_url, self.timeout) as s:
            s.mkdir(ex.ROOT)
            s.mkdir(self.layout.root)
            s.mkdir(self.layout.markers)
            yield s

    def _lay(self, s: libnfs.NfsSession, volume_id: str) -> ex.Layout:
        """Where the volume lives: the cluster's folder, or the layout before cluster ids for a
        volume found only there (used in place)."""
        if (self.legacy is not None and s.stat(self.layout.image(volume_id)) is None
                and s.stat(self.legacy.image(volume_id)) is not None):
            return self.legacy
        return self.layout

    def _qemu_img(self, *args: str, timeout: float | None = None) -> None:
        run(["qemu-img", *args], timeout=timeout or self.timeout)

    def _markers(self, s: libnfs.NfsSession, lay: ex.Layout, volume_id: str | None = None) -> list[ex.Marker]:
        found = [m for m in map(ex.parse_marker, s.listdir(lay.markers)) if m is not None]
        return [m for m in found if volume_id is None or m.volume_id == volume_id]

    def _size(self, s: libnfs.NfsSession, lay: ex.Layout, volume_id: str) -> int:
        entry = s.stat(lay.image(volume_id))
        if entry is None:
            raise VolumeNotFound(f"nfs volume {volume_id} not found on {self.export}")
        return entry.size

    def _info(self, s: libnfs.NfsSession, lay: ex.Layout, volume_id: str) -> VolumeInfo:
        size = self._size(s, lay, volume_id)
        prefix = f"{volume_id}@"
        snaps = tuple(n[len(prefix):-4] for n in s.listdir(lay.root) if n.startswith(prefix) and n.endswith(".img"))
        return VolumeInfo(volume_id, size // MIB, snaps)

    # -- VolumeDriver ----------------------------------------------------------------------------

    def probe(self) -> Capability:
        return probe_export(ProbeTarget(self.name, self.export, self.node_id, self.mount_root, self.timeout,
                                        self.layout.root))

    def provision(self, volume_id: str, size_mb: int, *, source: tuple[str, str] | None = None) -> VolumeInfo:
        check_volume_id(volume_id)
        check_size(size_mb)
        origin = parse_source(source) if source is not None else None
        with self._nfs() as s:
            lay = self._lay(s, volume_id)  # a new volume: the cluster's folder
            final = lay.image(volume_id)
            work = ex.tmp(final, self._holder)
            if s.stat(final) is None:  # the image is published last: it says the volume exists
                s.unlink(work)  # what a crashed attempt of this driver left
                if origin is None:
                    self._qemu_img("create", "-q", "-f", "raw", self.export.qemu_url(work), f"{size_mb}M")
                else:
                    vol, snap = origin
                    src_lay = self._lay(s, vol)
                    self._copy_from(s, src_lay, origin, work, size_mb)
                    src = src_lay.snap_folder(vol, snap) if snap else src_lay.folder(vol)
                    self._copy_folder(s, src, lay.folder(volume_id), final)
                s.link_new(work, final)  # False: another client published it first; theirs is kept
            s.unlink(work)  # also after a crash between the link and here
            s.mkdir(lay.folder(volume_id))  # the FILESYSTEM side (also after a crash between the two)
            return self._info(s, lay, volume_id)

    def _copy_folder(self, s: libnfs.NfsSession, src: str, dst: str, published: str) -> None:
        """Copy a volume's folder through a temporary name (a missing source: an empty folder),
        unless `published` (the image that says the copy is in use) appeared meanwhile: another
        client finished first, and its folder is kept."""
        work = ex.tmp(dst, self._holder)
        s.remove_tree(work)
        if s.stat(src, follow=False) is None:
            s.mkdir(work)
        else:
            with libnfs.session(self.export.libnfs_v3_url, self.timeout) as v3:  # see NfsExport.libnfs_v3_url
                v3.copy_tree(src, work)
        if s.stat(published) is not None:
            s.remove_tree(work)
            return
        # What is at `dst` is not in use yet (its image is not published): a complete copy by a
        # crashed attempt or by a client racing this one (the same content), or what a crashed
        # snapshot deletion left.
        s.remove_tree(dst)
        if not s.rename_new(work, dst):
            # A racing client renamed its complete copy there since: only whole copies are ever
            # renamed to `dst`, so theirs is as good as ours.
            s.remove_tree(work)

    def _remove_work(self, s: libnfs.NfsSession, name: str) -> None:
        """Every client's temporary copies of `name` (an image or a folder under ROOT), and the
        `<name>.tmp` of versions before per-client names."""
        folder, _, base = name.rpartition("/")
        prefix = base + ".tmp"  # ids hold no '.': only `name`'s own copies match
        for entry in s.listdir(folder):
            if entry.startswith(prefix):
                s.remove_tree(f"{folder}/{entry}")

    def _copy_from(self, s: libnfs.NfsSession, lay: ex.Layout, origin: tuple[str, str | None], work: str,
                   size_mb: int) -> None:
        vol, snap = origin
        if snap is None:
            if any(not m.read_only for m in self._markers(s, lay, vol)):
                raise VolumeBusy(f"source volume {vol} is attached for writing: detach it (or clone a snapshot)")
            src = lay.image(vol)
        else:
            src = lay.snap_image(vol, snap)
        entry = s.stat(src)
        if entry is None:
            raise VolumeNotFound(f"source {vol}{'@' + snap if snap else ''} not found on {self.export}")
        if size_mb * MIB < entry.size:
            raise Unsupported(f"size {size_mb} MiB is smaller than the source's {entry.size // MIB} MiB")
        self._qemu_img("convert", "-q", "-f", "raw", "-O", "raw", self.export.qemu_url(src),
                       self.export.qemu_url(work), timeout=self.copy_timeout)
        if size_mb * MIB > entry.size:
            self._qemu_img("resize", "-q", "-f", "raw", self.export.qemu_url(work), f"{size_mb}M")

    def info(self, volume_id: str) -> VolumeInfo:
        check_volume_id(volume_id)
        with self._nfs() as s:
            return self._info(s, self._lay(s, volume_id), volume_id)

    def resize(self, volume_id: str, size_mb: int) -> VolumeInfo:
        check_volume_id(volume_id)
        check_size(size_mb)
        with self._nfs() as s:
            lay = self._lay(s, volume_id)
            have = self._size(s, lay, volume_id)
            if size_mb * MIB < have:
                raise Unsupported(f"size {size_mb} MiB is smaller than {have // MIB} MiB: nfs volumes never shrink")
            if size_mb * MIB > have:  # a running VM sees the new size after its runtime's block_resize
                self._qemu_img("resize", "-q", "-f", "raw", self.export.qemu_url(lay.image(volume_id)), f"{size_mb}M")
            return self._info(s, lay, volume_id)

    def snapshot(self, volume_id: str, snap: str) -> None:
        check_volume_id(volume_id)
        check_snapshot_name(snap)
        with self._nfs() as s:
            lay = self._lay(s, volume_id)
            self._size(s, lay, volume_id)
            target = lay.snap_image(volume_id, snap)
            if s.stat(target) is not None:
                return
            writers = sorted(m.node_id for m in self._markers(s, lay, volume_id) if not m.read_only)
            if writers:  # NFS cannot hold writers still: a copy under them would not be crash-consistent
                raise VolumeBusy(f"volume {volume_id} is attached for writing on {', '.join(writers)}: detach it "
                                 "to snapshot")
            self._copy_folder(s, lay.folder(volume_id), lay.snap_folder(volume_id, snap), target)
            work = ex.tmp(target, self._holder)
            s.unlink(work)
            self._qemu_img("convert", "-q", "-f", "raw", "-O", "raw", self.export.qemu_url(lay.image(volume_id)),
                           self.export.qemu_url(work), timeout=self.copy_timeout)
            s.link_new(work, target)  # last: the snapshot exists once its image does
            s.unlink(work)

    def delete_snapshot(self, volume_id: str, snap: str) -> None:
        check_volume_id(volume_id)
        check_snapshot_name(snap)
        with self._nfs() as s:
            lay = self._lay(s, volume_id)
            target = lay.snap_image(volume_id, snap)
            s.unlink(target)  # first: the snapshot is gone once its image is
            s.remove_tree(lay.snap_folder(volume_id, snap))
            self._remove_work(s, target)
            self._remove_work(s, lay.snap_folder(volume_id, snap))

    def attach(self, volume_id: str, kind: AttachKind, *, read_only: bool = False) -> Attachment:
        check_volume_id(volume_id)
        kind = AttachKind(kind)
        if kind is AttachKind.FILESYSTEM:
            missing = kernel_client_missing()
            if missing:
                raise Unsupported(missing)
        mark = ex.Marker(volume_id, self.node_id, kind, read_only)
        with self._nfs() as s:
            lay = self._lay(s, volume_id)
            self._size(s, lay, volume_id)
            # Never VolumeBusy: writers on several nodes, or a VM disk attached twice on one, are the
            # control plane's call. Only one folder mount per node can exist, in one mode.
            clash = [m for m in self._markers(s, lay, volume_id) if m.node_id == self.node_id
                     and m.kind is AttachKind.FILESYSTEM and kind is AttachKind.FILESYSTEM and m != mark]
            if clash:
                mode = "read-only" if clash[0].read_only else "read-write"
                raise StorageError(f"volume {volume_id} is mounted {mode} on {self.node_id} already: detach it to "
                                   "mount it otherwise")
            s.touch(lay.marker(mark))  # first, so a crash before the mount still shows as attached
        if kind is AttachKind.VM_DISK:
            disk = DiskSource("nfs", self.export.qemu_url(lay.image(volume_id)))
            return Attachment(volume_id, self.node_id, kind, read_only, disk=disk, legacy=lay != self.layout)
        try:
            return self._mount_folder(lay, volume_id, read_only)
        except BaseException:
            with contextlib.suppress(Exception), self._nfs() as s:
                s.unlink(lay.marker(mark))  # not attached after all: the record goes with the failure
            raise

    def _mount_points(self, volume_id: str) -> list[Path]:
        """Where the volume may be mounted on this node: under the cluster's mount root, and (a
        mount from before cluster ids) straight under the configured one."""
        return [root / volume_id for root in (self.mount_root, self.legacy_mounts) if root is not None]

    def _mount_folder(self, lay: ex.Layout, volume_id: str, read_only: bool) -> Attachment:
        """A kernel NFSv4 mount of the volume's folder (untested on machines without nfs4)."""
        for mp in self._mount_points(volume_id):
            if nm.mount_at(mp) is not None:  # mounted already (a retry; or before the upgrade: kept)
                return Attachment(volume_id, self.node_id, AttachKind.FILESYSTEM, read_only, mount_path=str(mp))
        mp = self.mount_root / volume_id
        img.ensure_dir(mp)
        opts = f"port={self.export.port},nosuid,nodev,hard" + (",ro" if read_only else "")
        run(["mount", "-t", "nfs4", "-o", opts, self.export.kernel_source(lay.folder(volume_id)), str(mp)],
            timeout=self.timeout)
        return Attachment(volume_id, self.node_id, AttachKind.FILESYSTEM, read_only, mount_path=str(mp))

    def detach(self, volume_id: str) -> None:
        check_volume_id(volume_id)
        for mp in self._mount_points(volume_id):
            if nm.mount_at(mp) is not None:
                nm.unmount(mp, self.timeout)
            with contextlib.suppress(FileNotFoundError, OSError):
                mp.rmdir()  # (a legacy mount root's entry that is a cluster's folder is not empty: kept)
        with self._nfs() as s:
            lay = self._lay(s, volume_id)
            for m in self._markers(s, lay, volume_id):
                if m.node_id == self.node_id:
                    s.unlink(lay.marker(m))

    def fence(self, volume_id: str, node_id: str) -> None:
        """Forget `node_id`'s attachments of the volume (a dead node's records would block delete).
        NFS itself cannot cut a client off: that takes the server's export rules (its admin's)."""
        check_volume_id(volume_id)
        with self._nfs() as s:
            lay = self._lay(s, volume_id)
            for m in self._markers(s, lay, volume_id):
                if m.node_id == node_id:
                    s.unlink(lay.marker(m))

    def attached(self) -> list[Attachment]:
        found: dict[str, Attachment] = {}
        roots = [(self.mount_root, False)] + ([(self.legacy_mounts, True)] if self.legacy_mounts else [])
        for root, legacy in roots:  # the cluster's own first: a name found in both is its
            for m in nm.mounts_under(root):  # (the cluster folders under a legacy root are no mounts)
                vid = Path(m.mount_point).name
                found.setdefault(vid, Attachment(vid, self.node_id, AttachKind.FILESYSTEM, m.read_only,
                                                 mount_path=m.mount_point, legacy=legacy))
        layouts = [(self.layout, False)] + ([(self.legacy, True)] if self.legacy is not None else [])
        with self._nfs() as s:
            for lay, legacy in layouts:
                mine = [m for m in self._markers(s, lay) if m.node_id == self.node_id]
                for mark in sorted(mine, key=lambda m: (m.kind is not AttachKind.FILESYSTEM, m.read_only)):
                    if mark.volume_id in found:  # one per volume: a mount, else a writer, else a reader
                        continue
                    if mark.kind is AttachKind.VM_DISK:
                        disk = DiskSource("nfs", self.export.qemu_url(lay.image(mark.volume_id)))
                        found[mark.volume_id] = Attachment(mark.volume_id, self.node_id, mark.kind, mark.read_only,
                                                           disk=disk, legacy=legacy)
                    else:  # marked but not mounted: a crash between the two steps
                        found[mark.volume_id] = Attachment(mark.volume_id, self.node_id, mark.kind, mark.read_only,
                                                           mount_path=str(self.mount_root / mark.volume_id),
                                                           legacy=legacy)
        return [found[k] for k in sorted(found)]

    def delete(self, volume_id: str) -> None:
        check_volume_id(volume_id)
        with self._nfs() as s:
            lay = self._lay(s, volume_id)
            holders = sorted({m.node_id for m in self._markers(s, lay, volume_id)})
            if holders:
                raise VolumeBusy(f"volume {volume_id} is attached on {', '.join(holders)}: detach it before deleting")
            prefix = f"{volume_id}@"  # ids hold no '@': every such name is one of this volume's snapshots
            for name in s.listdir(lay.root):
                if name.startswith(prefix):
                    s.remove_tree(f"{lay.root}/{name}")
            s.remove_tree(lay.folder(volume_id))
            self._remove_work(s, lay.folder(volume_id))
            self._remove_work(s, lay.image(volume_id))
            s.unlink(lay.image(volume_id))  # last: the volume exists until its image is gone
