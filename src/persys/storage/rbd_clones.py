"""Clones, snapshot removal and image removal for the ceph-rbd driver: the steps that involve a
parent and its children, each one idempotent so a retry after a crash at any step converges.

A clone is made from a protected snapshot (a user's, or a hidden `_clone-<child>` one taken of a
source volume), grown to the size asked for, then flattened at once: the child no longer needs
its parent, so the parent volume or snapshot can be deleted later. Hidden snapshots start with
"_", which no user snapshot name can (base.SNAPSHOT_NAME_RE), and `info` does not list them.
"""

from __future__ import annotations

from typing import Any

from persys.storage.base import (
    SNAPSHOT_NAME_RE,
    StorageError,
    VolumeBusy,
    VolumeNotFound,
    check_volume_id,
)
from persys.storage.ceph_session import CephSession

Parent = tuple[str, str | None]  # (source volume, its snapshot; None: a volume, cloned through a hidden one)


def hidden_snapshot(name: str) -> bool:
    return name.startswith("_")


def clone_snapshot(child: str) -> str:
    return f"_clone-{child}"


def check_source(source: tuple[str, str]) -> Parent:
    """("snapshot", "<volume>@<snap>") or ("volume", "<volume>"); a clear error naming `source`."""
    if not isinstance(source, tuple) or len(source) != 2:
        raise StorageError("source: expected (\"snapshot\", \"<volume>@<snap>\") or (\"volume\", \"<volume>\")")
    kind, ref = source
    if kind not in ("volume", "snapshot"):
        raise StorageError(f"source: kind {kind!r} is neither 'snapshot' nor 'volume'")
    if not isinstance(ref, str):
        raise StorageError(f"source: {ref!r} is not a string")
    vol, at, snap = ref.partition("@")
    try:
        check_volume_id(vol)
    except StorageError as err:
        raise StorageError(f"source: {err}") from err
    if kind == "volume":
        if at:
            raise StorageError(f"source: {ref!r} is a snapshot, not a volume id")
        return vol, None
    if not SNAPSHOT_NAME_RE.fullmatch(snap):
        raise StorageError(f"source: {ref!r} is not <volume>@<snapshot>")
    return vol, snap


class CloneSteps:
    def __init__(self, session: CephSession, features: int) -> None:
        self._rbd = session.rbd
        self._features = features

    def _image(self, io: Any, name: str, *, what: str = "volume", read_only: bool = False,
               snap: str | None = None) -> Any:
        try:
            return self._rbd.Image(io, name, snapshot=snap, read_only=read_only)
        except self._rbd.ImageNotFound as err:
            at = f"{name}@{snap}" if snap else name
            raise VolumeNotFound(f"{what}: {at!r} does not exist") from err

    def clone(self, io: Any, child: str, size: int, parent: Parent) -> None:
        src, snap = parent
        with self._image(io, src, what="source") as img:
            names = {s["name"] for s in img.list_snaps()}
            if snap is not None and snap not in names:
                raise VolumeNotFound(f"source: snapshot '{src}@{snap}' does not exist")
            snap = snap or clone_snapshot(child)
            base = int(img.size()) if snap not in names else _snap_size(img, snap)
            if size < base:
                raise StorageError(f"size: {size >> 20} MiB is below the source's {base >> 20} MiB")
            if snap not in names:
                img.create_snap(snap)
            if not img.is_protected_snap(snap):
                img.protect_snap(snap)
        for _ in (1, 2):
            try:
                self._rbd.RBD().clone(io, src, snap, io, child, features=self._features)
                break
            except self._rbd.ImageExists:
                try:
                    self._rbd.Image(io, child, read_only=True).close()
                    break  # a retry: finish() below completes it
                except self._rbd.ImageNotFound:
                    self.remove_leftover(io, child)  # listed, not openable: a crash inside the clone
        self.finish(io, child, size, parent)

    def remove_leftover(self, io: Any, name: str) -> None:
        """What a crash inside librbd's create or remove leaves (listed, no header): removed."""
        try:
            self._rbd.RBD().remove(io, name)
        except self._rbd.ImageNotFound:
            pass

    def finish(self, io: Any, child: str, size: int, parent: Parent | None) -> None:
        """Grow, flatten and release the parent's snapshot; an image with no parent left: only
        the hidden snapshot a crash may have left on `parent` is removed."""
        with self._image(io, child) as img:
            try:
                _, src, snap = img.parent_info()
            except self._rbd.ImageNotFound:
                src, snap = "", ""
            if src:
                if size > int(img.size()):
                    img.resize(size)
                img.flatten()
        if src:
            self._release(io, src, snap)
        elif parent is not None and parent[1] is None:
            self._release(io, parent[0], clone_snapshot(child))

    def _release(self, io: Any, src: str, snap: str) -> None:
        """A snapshot used for cloning: unprotected when no clone needs it, removed if hidden."""
        try:
            img = self._rbd.Image(io, src)
        except self._rbd.ImageNotFound:
            return
        with img:
            if snap not in {s["name"] for s in img.list_snaps()}:
                return
            if list(_children(img, snap)):
                return  # another clone still being made from it
            if img.is_protected_snap(snap):
                img.unprotect_snap(snap)
            if hidden_snapshot(snap):
                img.remove_snap(snap)

    def remove_snapshot(self, io: Any, volume: str, snap: str) -> None:
        try:
            img = self._rbd.Image(io, volume)
        except self._rbd.ImageNotFound:
            return
        with img:
            self._remove_snap(io, img, snap)

    def _remove_snap(self, io: Any, img: Any, snap: str) -> None:
        if snap not in {s["name"] for s in img.list_snaps()}:
            return
        if img.is_protected_snap(snap):
            for child in list(_children(img, snap)):
                self._flatten(io, child)  # a clone a crash left unflattened: it keeps its data
            img.unprotect_snap(snap)
        try:
            img.remove_snap(snap)
        except self._rbd.ImageNotFound:
            pass

    def _flatten(self, io: Any, name: str) -> None:
        try:
            with self._rbd.Image(io, name) as child:
                child.flatten()
        except (self._rbd.ImageNotFound, self._rbd.InvalidArgument):
            pass  # gone, or already flat

    def remove_image(self, io: Any, volume: str) -> None:
        try:
            img = self._rbd.Image(io, volume)
        except self._rbd.ImageNotFound:
            return
        with img:
            try:
                _, src, psnap = img.parent_info()
            except self._rbd.ImageNotFound:
                src, psnap = "", ""
            for s in list(img.list_snaps()):
                self._remove_snap(io, img, s["name"])
        try:
            self._rbd.RBD().remove(io, volume)
        except self._rbd.ImageNotFound:
            pass
        except self._rbd.ImageBusy as err:
            raise VolumeBusy(f"volume {volume!r} is open by a client (a VM still running?)") from err
        except self._rbd.ImageHasSnapshots as err:
            raise VolumeBusy(f"volume {volume!r}: a snapshot was taken while deleting; retry") from err
        if src and hidden_snapshot(psnap):
            self._release(io, src, psnap)  # the hidden snapshot of an unfinished clone of it


def _snap_size(img: Any, snap: str) -> int:
    for s in img.list_snaps():
        if s["name"] == snap:
            return int(s["size"])
    return 0


def _children(img: Any, snap: str) -> list[str]:
    img.set_snap(snap)
    try:
        return [str(c["image"]) for c in img.list_children2() if not c.get("trash")]
    finally:
        img.set_snap(None)
