"""Sparse ext4 image files: create, copy and grow them, each step written to a temporary name and
renamed into place, so a crash leaves either nothing or a `.tmp` file the retry replaces."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from persys.storage.base import StorageError
from persys.storage.commands import CommandFailed, run

MIB = 1024 * 1024
FILE_MODE = 0o600
DIR_MODE = 0o700
# Folders on the way to a volume: the users workloads run as (a process's, QEMU's) must reach
# their own volume's mount point or image; nothing in them can be listed.
TRAVERSE_MODE = 0o711
# No lazy init: every inode table and the journal are written by mkfs, so no kernel thread keeps
# writing into a fresh volume after its first mount (and a snapshot right after is complete).
# -m 0: the whole size is the workload's (reserved blocks would only help root on the node).
MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0"]


def ensure_dir(path: Path, mode: int = DIR_MODE) -> None:
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    os.chmod(path, mode)


def tmp_of(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path) -> None:
    """Make a finished temporary file visible under its final name, durably."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(final.parent)


def fresh_tmp(final: Path) -> Path:
    """The temporary name for building `final`, with whatever a crashed attempt left removed."""
    tmp = tmp_of(final)
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    return tmp


def create_formatted(final: Path, size_mb: int, timeout: float) -> None:
    tmp = fresh_tmp(final)
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
    try:
        os.ftruncate(fd, size_mb * MIB)  # sparse: nothing is allocated until written
    finally:
        os.close(fd)
    try:
        run([*MKFS, str(tmp)], timeout=timeout)
    except StorageError:
        tmp.unlink(missing_ok=True)
        raise
    publish(tmp, final)


def copy_sparse(src: Path, final: Path, timeout: float) -> None:
    """A sparse copy (a reflink where the pool's filesystem has them) of an image nobody writes to
    during the copy (unmounted, or frozen by the caller)."""
    tmp = fresh_tmp(final)
    try:
        run(["cp", "--reflink=auto", "--sparse=always", str(src), str(tmp)], timeout=timeout)
        os.chmod(tmp, FILE_MODE)
    except (StorageError, OSError):
        tmp.unlink(missing_ok=True)
        raise
    publish(tmp, final)


def size_mb(path: Path) -> int:
    return path.stat().st_size // MIB


def fs_bytes(device_or_image: str, timeout: float) -> int:
    """The ext4 filesystem's own size (block count x block size), from its superblock."""
    out = run(["dumpe2fs", "-h", device_or_image], timeout=timeout).stdout
    count = re.search(r"^Block count:\s+(\d+)", out, re.M)
    block = re.search(r"^Block size:\s+(\d+)", out, re.M)
    if not count or not block:
        raise StorageError(f"{device_or_image}: no ext4 superblock found (dumpe2fs)")
    return int(count.group(1)) * int(block.group(1))


def grow_file(path: Path, new_mb: int) -> None:
    if path.stat().st_size < new_mb * MIB:
        os.truncate(path, new_mb * MIB)


def grow_offline(image: Path, timeout: float) -> None:
    """Grow an unmounted image's filesystem to the file's size (after `grow_file`)."""
    try:
        run(["e2fsck", "-f", "-p", str(image)], timeout=timeout)
    except CommandFailed as e:
        if e.returncode not in (1, 2):  # 1, 2: errors corrected; anything else needs a human
            raise
    run(["resize2fs", str(image)], timeout=timeout)


CAP_SYS_RESOURCE = 24


def can_grow_online() -> bool:
    """The kernel lets only CAP_SYS_RESOURCE grow a mounted ext4 (containers often drop it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return False


def grow_online(device: str, timeout: float) -> None:
    """Grow a mounted filesystem on loop `device` after its backing file grew."""
    run(["losetup", "-c", device], timeout=timeout)  # the loop device learns the new file size
    run(["resize2fs", device], timeout=timeout)
