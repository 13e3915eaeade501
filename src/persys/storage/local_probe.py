"""The `local` driver's probe: really create, format, loop-mount, write and unmount a tiny image
under the pool. Each failure becomes the reason a kind is missing, with the fix where known.

VM_DISK needs a formatted image file only (QEMU opens it; the VM runtime probes QEMU itself);
FILESYSTEM needs a free loop device and an ext4 loop mount as well."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from persys.storage import ext4_images as img
from persys.storage import node_mounts as nm
from persys.storage.base import AttachKind, Capability, StorageError
from persys.storage.commands import run
from persys.storage.loop_mount import mount_image

PROBE_MB = 4  # big enough for ext4 with a journal, small enough to cost nothing
TOOLS = {"mkfs.ext4": "e2fsprogs", "resize2fs": "e2fsprogs", "dumpe2fs": "e2fsprogs", "e2fsck": "e2fsprogs",
         "losetup": "util-linux", "mount": "mount", "umount": "mount", "fsfreeze": "util-linux", "cp": "coreutils"}
BOTH = (AttachKind.FILESYSTEM, AttachKind.VM_DISK)


def _nothing(name: str, reason: str) -> Capability:
    return Capability(name, frozenset(), {k: reason for k in BOTH})


def missing_tools() -> list[str]:
    return [f"{tool} missing (install {pkg})" for tool, pkg in TOOLS.items() if shutil.which(tool) is None]


def _sweep(folder: Path, image: Path, timeout: float) -> None:
    """Remove what an earlier probe left (a crash mid-probe): its mount, its loop device, files."""
    mnt = folder / "mnt"
    if nm.mount_at(mnt) is not None:
        nm.unmount(mnt, timeout)
    if shutil.which("losetup"):
        for loop in nm.loops_backed_by({str(image)}, timeout):
            nm.free_loop(loop.name, timeout)
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)


def _writable_pool(pool: Path) -> str:
    """'' when the pool folder can hold volumes, else why not."""
    try:
        img.ensure_dir(pool, img.TRAVERSE_MODE)  # the driver's mode: a workload's command must reach its mount
        probe = pool / ".probe-write"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as e:
        return f"pool folder {pool} not writable: {e.strerror or e}"
    return ""


def _loop_mount_works(folder: Path, image: Path, timeout: float) -> str:
    """'' when the image loop-mounts and takes a write, else why not."""
    try:
        run(["losetup", "--find"], timeout=timeout)
    except StorageError as e:
        return f"no loop device free ({e}): detach unused ones (losetup -D) or allow more (max_loop)"
    mnt = folder / "mnt"
    img.ensure_dir(mnt)
    try:
        mount_image(image, mnt, read_only=False, timeout=timeout)
    except StorageError as e:
        return f"ext4 loop mount failed: {e}"
    try:
        (mnt / "probe").write_bytes(b"persys")
        os.sync()
    except OSError as e:
        return f"writing to a loop-mounted ext4 volume failed: {e.strerror or e}"
    finally:
        nm.unmount(mnt, timeout)
    return ""


def probe_pool(name: str, pool: Path, timeout: float) -> Capability:
    gaps = missing_tools()
    if gaps:
        return _nothing(name, "; ".join(gaps))
    reason = _writable_pool(pool)
    if reason:
        return _nothing(name, reason)
    folder = pool / ".probe"
    image = folder / "probe.img"
    try:
        _sweep(folder, image, timeout)
        img.ensure_dir(folder)
        try:
            img.create_formatted(image, PROBE_MB, timeout)
        except (StorageError, OSError) as e:
            return _nothing(name, f"cannot create an ext4 image in {pool}: {e}")
        fs_reason = _loop_mount_works(folder, image, timeout)
    finally:
        with contextlib.suppress(StorageError, OSError):
            _sweep(folder, image, timeout)
    missing = {AttachKind.FILESYSTEM: fs_reason} if fs_reason else {}
    kinds = frozenset(k for k in BOTH if k not in missing)
    return Capability(name, kinds, missing, block=True)
