"""A tiny real guest for the microVM runtime tests: Debian's kernel, a busybox initramfs, an ext4 rootfs.

Built once into CACHE_DIR (reused by later sessions while its files are there):

- `vmlinux`: the uncompressed kernel, taken from the XZ stream inside Debian's bzImage. Both
  Firecracker and QEMU's `microvm` machine boot it straight through its PVH entry point.
- `initrd.img`: busybox-static plus the kernel modules the guest needs. Debian builds virtio,
  virtio_mmio, virtio_blk and ext4 as modules (only the 8250 serial console is built in), so /init
  loads them with insmod in dependency order, mounts /dev/vda, prints markers to the serial console
  and then idles as PID 1 so the VM keeps running.
- `rootfs.ext4`: a small ext4 image (made with `mke2fs -d`, no mounting needed) holding hello.txt.

Needs: qemu-system-x86 (the tests skip without it), apt-get (with package lists) and dpkg-deb to
fetch the kernel, busybox-static, and e2fsprogs' mke2fs.
"""

from __future__ import annotations

import gzip
import io
import lzma
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

CACHE_DIR = Path(os.environ.get("PERSYS_MICROVM_CACHE", "/var/tmp/persys-test-microvm"))
BOOT_MARKER = "PERSYS-MICROVM-BOOTED"
ROOTFS_MARKER = "PERSYS-ROOTFS-SAYS"
ROOTFS_TEXT = "hello from the rootfs"
# Loaded in this order (dependencies first). crc32c_generic is a soft dependency of ext4
# (metadata checksums) that `depends=` does not list.
GUEST_MODULES = ("virtio_ring", "virtio", "virtio_mmio", "virtio_blk", "crc16", "mbcache", "jbd2",
                 "crc32c_generic", "ext4")
BUILD_VERSION = "1"  # bump when the guest's contents change, so stale caches are rebuilt

INIT_SCRIPT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
marker=$(sed -n 's/.*persys.marker=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
echo "{BOOT_MARKER} $marker"
for m in $(cat /modules.order); do insmod /modules/$m.ko || echo "insmod $m failed"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
mkdir -p /mnt
if mount -t ext4 /dev/vda /mnt; then
  echo "{ROOTFS_MARKER} $(cat /mnt/hello.txt)"
  echo "written by the guest" > /mnt/guest-wrote.txt
  sync
else
  echo "PERSYS-ROOTFS-MOUNT-FAILED"
fi
# PID 1 must never exit (that panics the kernel): idle so the VM keeps running.
while true; do sleep 3600; done
"""


@dataclass(frozen=True)
class GuestImages:
    kernel: Path  # uncompressed vmlinux (PVH)
    initrd: Path
    rootfs: Path
    kernel_version: str


def _run(argv: list[str], cwd: Path | None = None) -> str:
    return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True, timeout=300).stdout


def _kernel_package() -> str:
    """The linux-image-<ver>-amd64 package that Debian's linux-image-amd64 meta package points at."""
    out = _run(["apt-cache", "depends", "linux-image-amd64"])
    for line in out.splitlines():
        m = re.match(r"\s*Depends:\s*(linux-image-\S+-amd64)", line)
        if m:
            return m.group(1)
    raise RuntimeError("apt-cache knows no linux-image-amd64 (run apt-get update)")


def _cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data) entries: enough for an initramfs, no cpio binary needed."""
    out = io.BytesIO()

    def pad(n: int) -> None:
        out.write(b"\0" * (-n % 4))

    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        raw_name = name.encode() + b"\0"
        fields = [ino if name != "TRAILER!!!" else 0, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw_name), 0]
        header = b"070701" + b"".join(f"{f:08x}".encode() for f in fields)
        out.write(header + raw_name)
        pad(len(header) + len(raw_name))
        out.write(data)
        pad(len(data))
    return out.getvalue()


def _build_initrd(modules_root: Path, dest: Path) -> None:
    found = {p.name.removesuffix(".ko").replace("-", "_"): p for p in modules_root.rglob("*.ko")}
    missing = [m for m in GUEST_MODULES if m not in found]
    if missing:
        raise RuntimeError(f"kernel package lacks modules {missing}")
    busybox = Path(shutil.which("busybox") or "/bin/busybox").read_bytes()
    if b"ld-linux" in busybox[:4096]:  # a dynamic binary names its loader in .interp, near the start
        raise RuntimeError("busybox is dynamically linked: apt-get install busybox-static")
    entries: list[tuple[str, int, bytes]] = [
        (d, 0o040755, b"") for d in ("bin", "dev", "proc", "sys", "mnt", "modules")
    ]
    entries += [
        ("bin/busybox", 0o100755, busybox),
        ("init", 0o100755, INIT_SCRIPT.encode()),
        ("modules.order", 0o100644, " ".join(GUEST_MODULES).encode()),
    ]
    entries += [(f"modules/{m}.ko", 0o100644, found[m].read_bytes()) for m in GUEST_MODULES]
    dest.write_bytes(gzip.compress(_cpio_newc(entries), compresslevel=1))


def _build_rootfs(dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "hello.txt").write_text(ROOTFS_TEXT + "\n")
        with open(dest, "wb") as f:
            f.truncate(16 * 1024 * 1024)
        _run(["mke2fs", "-q", "-F", "-t", "ext4", "-d", tmp, "-L", "persys-test", str(dest)])


def build_guest(cache_dir: Path = CACHE_DIR) -> GuestImages:
    """Builds (or reuses) the guest images; safe to call from several processes (atomic renames)."""
    pkg = _kernel_package()
    version = pkg.removeprefix("linux-image-")
    out = cache_dir / f"{version}-v{BUILD_VERSION}"
    images = GuestImages(out / "vmlinux", out / "initrd.img", out / "rootfs.ext4", version)
    if all(p.exists() for p in (images.kernel, images.initrd, images.rootfs)):
        return images
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        work = Path(tmp)
        _run(["apt-get", "download", pkg], cwd=work)
        deb = next(work.glob("linux-image-*.deb"))
        # Only /boot and the module tree are needed; the rest of the package is firmware-free anyway.
        _run(["dpkg-deb", "-x", str(deb), str(work / "x")])
        bz = (work / "x" / "boot" / f"vmlinuz-{version}").read_bytes()
        start = bz.find(b"\xfd7zXZ\x00")
        if start < 0:
            raise RuntimeError("no XZ stream in the bzImage")
        (work / "vmlinux").write_bytes(lzma.LZMADecompressor().decompress(bz[start:]))
        _build_initrd(work / "x" / "lib" / "modules" / version, work / "initrd.img")
        _build_rootfs(work / "rootfs.ext4")
        for src, dst in ((work / "vmlinux", images.kernel), (work / "initrd.img", images.initrd),
                         (work / "rootfs.ext4", images.rootfs)):
            os.replace(src, dst)
    return images


def qemu_available() -> bool:
    return shutil.which("qemu-system-x86_64") is not None


@pytest.fixture(scope="session")
def microvm_guest() -> Iterator[GuestImages]:
    if not qemu_available():
        pytest.skip("qemu-system-x86_64 is not installed")
    yield build_guest()


if __name__ == "__main__":  # `python -m tests.microvm_fixtures` pre-builds the cache (e.g. in CI setup)
    print(build_guest())
