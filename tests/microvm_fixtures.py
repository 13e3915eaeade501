"""A tiny real guest for the microVM runtime tests: Debian's kernel, a busybox initramfs, an ext4 rootfs.

Built once into CACHE_DIR (reused by later sessions while its files are there):

- `vmlinux`: the uncompressed kernel, taken from the XZ stream inside Debian's bzImage (`vmlinuz`,
  kept too). Firecracker only loads ELF kernels, and QEMU's `microvm` machine boots it through its
  PVH entry point in ~2 s under TCG, where the bzImage through qboot printed nothing in 40 s.
- `initrd.img`: busybox-static plus the kernel modules the guest needs. Debian builds virtio,
  virtio_mmio, virtio_blk and ext4 as modules (only the 8250 serial console is built in), so /init
  loads them with insmod in dependency order, mounts /dev/vda, prints markers to the serial console
  and then idles as PID 1 so the VM keeps running.
- `rootfs.ext4`: a small ext4 image (made with `mke2fs -d`, no mounting needed) holding hello.txt.

Needs: qemu-system-x86 and qemu-utils (the tests skip without qemu-system-x86_64), apt-get (with
package lists) and dpkg-deb to fetch the kernel, busybox-static, and e2fsprogs' mke2fs. The
initramfs is written as a newc cpio archive here, so no cpio binary is needed.
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

try:
    import pytest
except ImportError:  # the README's guest-image command runs this module without the test extras
    pytest = None  # type: ignore[assignment]

CACHE_DIR = Path(os.environ.get("PERSYS_MICROVM_CACHE", "/var/tmp/persys-test-microvm"))
BOOT_MARKER = "PERSYS-MICROVM-BOOTED"
ROOTFS_MARKER = "PERSYS-ROOTFS-SAYS"
ROOTFS_TEXT = "hello from the rootfs"
PERSISTED_MARKER = "PERSYS-EARLIER-WRITE-FOUND"
POWEROFF_MARKER = "PERSYS-POWERING-OFF"
READY_MARKER = "PERSYS-GUEST-READY"  # the last line /init prints
# Loaded in this order (dependencies first). crc32c_generic is a soft dependency of ext4
# (metadata checksums) that `depends=` does not list.
GUEST_MODULES = ("virtio_ring", "virtio", "virtio_mmio", "virtio_blk", "crc16", "mbcache", "jbd2",
                 "crc32c_generic", "ext4")
BUILD_VERSION = "6"  # bump when the guest's contents change, so stale caches are rebuilt

INIT_SCRIPT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
marker=$(sed -n 's/.*persys.marker=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
echo "{BOOT_MARKER} $marker"
if grep -q persys.poweroff /proc/cmdline; then
  echo "{POWEROFF_MARKER}"
  poweroff -f
fi
for m in $(cat /modules.order); do insmod /modules/$m.ko || echo "insmod $m failed"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
mkdir -p /mnt
if mount -t ext4 /dev/vda /mnt; then
  echo "{ROOTFS_MARKER} $(cat /mnt/hello.txt)"
  # A disk kept across restarts still has what an earlier boot wrote.
  [ -f /mnt/guest-wrote.txt ] && echo "{PERSISTED_MARKER}"
  echo "written by the guest" > /mnt/guest-wrote.txt
  sync
else
  echo "PERSYS-ROOTFS-MOUNT-FAILED"
fi
echo "{READY_MARKER}"
# PID 1 must never exit (that panics the kernel): a shell on the console (`persysctl console`),
# started again when one exits, keeps the VM running.
while true; do sh; done
"""


@dataclass(frozen=True)
class GuestImages:
    kernel: Path  # uncompressed vmlinux (PVH)
    bzimage: Path  # the same kernel as Debian ships it
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

    def images_in(out: Path, version: str) -> GuestImages:
        return GuestImages(out / "vmlinux", out / "vmlinuz", out / "initrd.img", out / "rootfs.ext4", version)

    # A complete build of this guest version is reused whatever kernel it has: no apt lookup needed.
    for out in sorted(cache_dir.glob(f"*-v{BUILD_VERSION}")):
        cached = images_in(out, out.name.removesuffix(f"-v{BUILD_VERSION}"))
        if all(p.exists() for p in (cached.kernel, cached.bzimage, cached.initrd, cached.rootfs)):
            return cached
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        work = Path(tmp)
        pkg = _kernel_package()
        try:
            _run(["apt-get", "download", pkg], cwd=work)
        except subprocess.CalledProcessError:
            # Stale package lists name a .deb the mirror no longer has: refresh them once.
            _run(["apt-get", "update", "-qq"])
            pkg = _kernel_package()
            _run(["apt-get", "download", pkg], cwd=work)
        version = pkg.removeprefix("linux-image-")
        deb = next(work.glob("linux-image-*.deb"))
        _run(["dpkg-deb", "-x", str(deb), str(work / "x")])
        os.replace(work / "x" / "boot" / f"vmlinuz-{version}", work / "vmlinuz")
        bz = (work / "vmlinuz").read_bytes()
        start = bz.find(b"\xfd7zXZ\x00")
        if start < 0:
            raise RuntimeError("no XZ stream in the bzImage")
        (work / "vmlinux").write_bytes(lzma.LZMADecompressor().decompress(bz[start:]))
        _build_initrd(work / "x" / "lib" / "modules" / version, work / "initrd.img")
        _build_rootfs(work / "rootfs.ext4")
        out = cache_dir / f"{version}-v{BUILD_VERSION}"
        out.mkdir(exist_ok=True)
        images = images_in(out, version)
        # The kernel last: its presence is what marks a build complete for other processes.
        for name, dst in (("vmlinuz", images.bzimage), ("initrd.img", images.initrd),
                          ("rootfs.ext4", images.rootfs), ("vmlinux", images.kernel)):
            os.replace(work / name, dst)
    for old in cache_dir.glob("*-v*"):  # earlier builds of this guest
        if old != out and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return images


def qemu_available() -> bool:
    return shutil.which("qemu-system-x86_64") is not None


if pytest is not None:  # fixtures only where pytest runs
    @pytest.fixture(scope="session")
    def microvm_guest() -> Iterator[GuestImages]:
        if not qemu_available():
            pytest.skip("qemu-system-x86_64 is not installed")
        yield build_guest()


def install(images: GuestImages, dest: Path) -> None:
    """Copies the guest to `dest` under stable names (the paths examples/hello-microvm.yaml uses)."""
    dest.mkdir(parents=True, exist_ok=True)
    for src, name in ((images.kernel, "vmlinux"), (images.initrd, "initrd.img"), (images.rootfs, "rootfs.ext4")):
        shutil.copyfile(src, dest / name)


if __name__ == "__main__":
    # `python -m tests.microvm_fixtures [DIR]` pre-builds the cache (e.g. in CI setup) and, given
    # DIR, installs the guest there.
    import sys

    guest = build_guest()
    if len(sys.argv) > 1:
        install(guest, Path(sys.argv[1]))
    print(guest)
