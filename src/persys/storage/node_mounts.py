"""What the node kernel says is mounted and loop-attached (`/proc/self/mountinfo`, sysfs),
and the mount/unmount steps the drivers share. State is always read from the kernel, never kept
in memory, so a fresh driver instance after a crash sees what the old one left."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from persys.storage.base import StorageError
from persys.storage.commands import CommandFailed, run

log = logging.getLogger(__name__)

UMOUNT_TRIES = 3  # a busy mount gets a few chances before the lazy unmount (the last resort)


@dataclass(frozen=True, slots=True)
class Mount:
    mount_point: str
    source: str
    fstype: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class LoopDevice:
    name: str  # /dev/loopN
    back_file: str  # without the " (deleted)" suffix
    read_only: bool


_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        cols, rcols = left.split(), right.split()
        if len(cols) < 6 or len(rcols) < 2:
            continue
        opts = cols[5].split(",")
        mounts.append(Mount(_unescape(cols[4]), _unescape(rcols[1]), rcols[0], "ro" in opts))
    return mounts


def mounts_under(folder: Path) -> list[Mount]:
    """Mounts whose mount point is directly inside `folder` (one per volume), latest last."""
    text = Path("/proc/self/mountinfo").read_text()
    base = str(folder)
    return [m for m in parse_mountinfo(text) if os.path.dirname(m.mount_point) == base]


def mount_at(path: Path) -> Mount | None:
    text = Path("/proc/self/mountinfo").read_text()
    found = [m for m in parse_mountinfo(text) if m.mount_point == str(path)]
    return found[-1] if found else None  # stacked mounts: the top one is what is seen


SYS_BLOCK = Path("/sys/block")


def loop_devices(timeout: float) -> list[LoopDevice]:
    """The bound loop devices, read from sysfs (what `losetup` reads, without a process: this runs
    before every attach and detach); `losetup -J` where sysfs has no block folder."""
    if not SYS_BLOCK.is_dir():
        return _losetup_devices(timeout)
    devices = []
    for dev in sorted(SYS_BLOCK.glob("loop*")):
        try:
            back = (dev / "loop" / "backing_file").read_text().rstrip("\n")
            ro = (dev / "ro").read_text().strip() == "1"
        except (FileNotFoundError, NotADirectoryError):
            continue  # not bound (its loop/ folder exists only while it is), or unbound meanwhile
        devices.append(LoopDevice(f"/dev/{dev.name}", back.removesuffix(" (deleted)"), ro))
    return devices


def _losetup_devices(timeout: float) -> list[LoopDevice]:
    out = run(["losetup", "-J", "-l"], timeout=timeout).stdout.strip()
    if not out:
        return []  # losetup prints nothing at all when no device is attached
    devices = []
    for d in json.loads(out).get("loopdevices", []):
        back = str(d.get("back-file") or "").removesuffix(" (deleted)")
        devices.append(LoopDevice(str(d["name"]), back, bool(d.get("ro"))))
    return devices


def loops_backed_by(files: set[str], timeout: float) -> list[LoopDevice]:
    return [d for d in loop_devices(timeout) if d.back_file in files]


def free_loop(device: str, timeout: float) -> None:
    try:
        run(["losetup", "-d", device], timeout=timeout)
    except CommandFailed as e:
        if "No such device" not in e.output and "No such device or address" not in e.output:
            raise


def unmount(path: Path, timeout: float) -> None:
    """Unmount `path` (all stacked mounts). Busy: retried, then lazily as a last resort, which
    the log says (the data stays reachable to whoever holds it open until they close it)."""
    for attempt in range(UMOUNT_TRIES):
        if mount_at(path) is None:
            return
        try:
            run(["umount", str(path)], timeout=timeout)
        except CommandFailed as e:
            if "not mounted" in e.output:
                return
            if attempt + 1 < UMOUNT_TRIES:
                time.sleep(0.2 * (attempt + 1))
    if mount_at(path) is not None:
        log.warning("unmount of %s busy after %d tries: lazy unmount (detached now, freed when its last user closes)",
                    path, UMOUNT_TRIES)
        run(["umount", "-l", str(path)], timeout=timeout)
    if mount_at(path) is not None:
        raise StorageError(f"{path} is still mounted after a lazy unmount")
