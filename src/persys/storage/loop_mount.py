"""Loop-mounting an image file with the kernel's own calls: a free loop device bound to the file
by one LOOP_CONFIGURE ioctl, then mount(2). `mount -o loop` does the same, but starting it and
libmount's parsing of the mount tables cost ~3 ms of a ~4.5 ms mount, and this stands between a
local volume's workload and its start. Wherever the calls are not available (a kernel before
5.8, no /dev/loop-control, no device node, no mount in the C library) or the kernel refuses, the
`mount` binary runs instead: it is the reference, and its message is the one an operator knows.

As with `mount -o loop`, the device is bound with autoclear: the kernel frees it at the unmount
(and at once if the mount fails: the only other opener is this module, which closes it)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path

from persys.storage.commands import run

log = logging.getLogger(__name__)

LOOP_CONTROL = "/dev/loop-control"
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A  # Linux 5.8: bind, set flags and status in one call
LO_FLAGS_READ_ONLY = 1
LO_FLAGS_AUTOCLEAR = 4
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
# struct loop_info64: 5 u64, 4 u32, file name[64], crypt name[64], key[32], 2 u64 (232 bytes);
# struct loop_config: u32 fd, u32 block size, the info, 8 reserved u64 (304 bytes).
_INFO = struct.Struct("=5Q4I64s64s32s2Q")
_CONFIG_HEAD = struct.Struct("=II")
_RESERVED = bytes(64)
CLAIM_TRIES = 5  # another process may take the free device between asking and binding


class _NativeUnavailable(Exception):
    """The fast path cannot run here (or the kernel refused): the binary runs instead."""


def _libc_mount() -> Callable[..., int] | None:
    try:  # the C library this interpreter already has loaded (find_library would start ldconfig)
        fn = ctypes.CDLL(None, use_errno=True).mount
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


_MOUNT = _libc_mount()


def _config(backing_fd: int, image: Path, read_only: bool) -> bytes:
    flags = LO_FLAGS_AUTOCLEAR | (LO_FLAGS_READ_ONLY if read_only else 0)
    name = os.fsencode(str(image))[:63]  # what the kernel reports as the backing file is the real path
    info = _INFO.pack(0, 0, 0, 0, 0, 0, 0, 0, flags, name, b"", b"", 0, 0)
    return _CONFIG_HEAD.pack(backing_fd, 0) + info + _RESERVED


def _free_device() -> str:
    ctl = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    try:
        return f"/dev/loop{fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)}"
    finally:
        os.close(ctl)


def _mount_native(image: Path, mount_point: Path, fstype: str, read_only: bool) -> None:
    if _MOUNT is None:
        raise _NativeUnavailable("no C library to call mount(2) through")
    access = os.O_RDONLY if read_only else os.O_RDWR
    flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)
    backing = os.open(image, access | os.O_CLOEXEC)
    try:
        for _ in range(CLAIM_TRIES):
            device = _free_device()
            loop = os.open(device, access | os.O_CLOEXEC)
            try:
                try:
                    fcntl.ioctl(loop, LOOP_CONFIGURE, _config(backing, image, read_only))
                except OSError as e:
                    if e.errno == errno.EBUSY:
                        continue  # taken meanwhile: ask for another
                    raise
                # Mounted while this descriptor still holds the device: closing it afterwards
                # leaves the mount as its only user (autoclear frees it at the unmount).
                if _MOUNT(os.fsencode(device), os.fsencode(str(mount_point)), fstype.encode(), flags, None) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"mount {device} on {mount_point}: {os.strerror(err)}")
                return
            finally:
                os.close(loop)
        raise _NativeUnavailable(f"no loop device could be claimed in {CLAIM_TRIES} tries")
    finally:
        os.close(backing)


def mount_image(image: Path, mount_point: Path, *, read_only: bool, timeout: float, fstype: str = "ext4") -> None:
    """Loop-mount `image` on `mount_point` (nosuid, nodev; ro when asked). StorageError (from
    the `mount` binary, the fallback) when it cannot be mounted."""
    try:
        _mount_native(image, mount_point, fstype, read_only)
        return
    except (OSError, _NativeUnavailable) as e:
        log.debug("loop mount of %s through the kernel's calls failed (%s): running mount", image, e)
    opts = "loop,nosuid,nodev" + (",ro" if read_only else "")
    run(["mount", "-t", fstype, "-o", opts, str(image), str(mount_point)], timeout=timeout)
