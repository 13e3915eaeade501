"""Session fixtures for VM tests: a running libvirtd and a tiny guest that reads its cloud-init seed.

The guest is built once into a cache dir (`$PERSYS_TEST_GUEST_DIR`, default
/var/tmp/persys-test-guest/) and reused by later sessions:

- the kernel of Debian's linux-image-*-amd64 package (`apt-get download`, `dpkg-deb -x`),
  decompressed to an ELF `vmlinux` so QEMU boots it through PVH: that skips SeaBIOS's real-mode
  bzImage path and the XZ decompressor, which halves a TCG boot;
- an uncompressed initramfs: busybox-static as /init plus the modules needed to reach the IDE
  cdrom (ata_piix, sr_mod, isofs), the virtio disk, balloon and NIC, loaded with insmod in
  dependency order (read from each module's `.modinfo`, so depmod/kmod is not needed);
- a small qcow2 base disk whose first sector holds a marker the guest prints.

The guest prints GUEST_BOOTED, the seed's volume label, user-data and meta-data, then the base
disk's marker, writes GUEST_WROTE over the disk's first bytes (which must land in the overlay,
never in the base), prints GUEST_DATA and the first bytes of a second disk (a volume) if it has
one, then GUEST_READY and runs a shell on its console (for `persysctl console`), or powers
off with `persys.poweroff` on the kernel command line. With a NIC it asks for a DHCP lease in
the background and prints `PERSYS-GUEST-IP <address>`.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

try:
    import pytest
except ImportError:  # the README's guest-image command runs this module without the test extras
    pytest = None  # type: ignore[assignment]

__all__ = [
    "BASE_MARKER",
    "GUEST_BOOTED",
    "GUEST_DATA",
    "GUEST_READY",
    "GUEST_WROTE",
    "TestGuest",
    "VMHost",
    "build_test_guest",
    "test_guest",
    "vm_host",
]

REPO = Path(__file__).resolve().parents[1]
START_LIBVIRTD = REPO / "scripts" / "start-libvirtd.sh"
CACHE_DIR = Path(os.environ.get("PERSYS_TEST_GUEST_DIR", "/var/tmp/persys-test-guest"))
GUEST_VERSION = "9"  # bump when the guest recipe changes so stale caches are rebuilt
BASE_MARKER = "PERSYS-BASE-IMAGE-MARKER"
GUEST_BOOTED = "PERSYS-GUEST-BOOTED"
GUEST_READY = "PERSYS-GUEST-READY"
GUEST_WROTE = "PERSYS-GUEST-WROTE"
GUEST_DATA = "PERSYS-GUEST-DATA"

# Loaded in this order after their dependencies; everything else the guest needs is built in.
WANTED_MODULES = ("ata_piix", "sr_mod", "isofs", "virtio_pci", "virtio_blk", "virtio_balloon", "virtio_net")

INIT_SCRIPT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "{GUEST_BOOTED} kernel=$(uname -r)"
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m.ko 2>/dev/null; done
i=0
while [ ! -b /dev/sr0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
mkdir -p /seed
if mount -t iso9660 -o ro /dev/sr0 /seed; then
  # The ISO9660 volume id: bytes 40-71 of the primary volume descriptor (sector 16).
  label=$(dd if=/dev/sr0 bs=1 skip=32808 count=32 2>/dev/null | tr -d ' ')
  echo "PERSYS-GUEST-SEED label=$label files=$(ls /seed | tr '\\n' ' ')"
  echo "--- user-data ---"; cat /seed/user-data; echo
  echo "--- meta-data ---"; cat /seed/meta-data; echo
  echo "--- end of seed ---"
else
  echo "PERSYS-GUEST-NOSEED"
fi
i=0
while [ ! -b /dev/vda ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
if [ -b /dev/vda ]; then
  echo "PERSYS-GUEST-DISK $(dd if=/dev/vda bs=64 count=1 2>/dev/null | tr -cd 'A-Z-')"
  echo -n "{GUEST_WROTE}" | dd of=/dev/vda conv=notrunc,fsync 2>/dev/null
  echo "{GUEST_WROTE} to /dev/vda"
fi
if [ -b /dev/vdb ]; then  # a volume: print what its first bytes say
  echo "{GUEST_DATA} $(dd if=/dev/vdb bs=64 count=1 2>/dev/null | tr -cd 'A-Z-')"
fi
if [ -e /sys/class/net/eth0 ]; then
  ip link set eth0 up
  udhcpc -i eth0 -q -n -t 5 -s /bin/dhcp-event >/dev/null 2>&1 &
fi
echo "{GUEST_READY}"
if grep -q persys.poweroff /proc/cmdline; then wait; poweroff -f; fi  # wait: let DHCP finish
# An interactive shell on the serial console (`persysctl console`), started again when one exits.
while true; do sh; done
"""


# udhcpc calls this with the lease in the environment; the guest reports its address on the console.
DHCP_SCRIPT = """#!/bin/sh
if [ "$1" = bound ]; then ip addr add "$ip/${mask:-24}" dev "$interface" && echo "PERSYS-GUEST-IP $ip" >/dev/console; fi
"""


@dataclass(frozen=True)
class TestGuest:
    __test__ = False  # not a test class, despite the name

    kernel: Path  # uncompressed vmlinux (PVH)
    initrd: Path
    base_disk: Path  # qcow2 holding BASE_MARKER in its first sector
    kernel_version: str


@dataclass(frozen=True)
class VMHost:
    uri: str
    run_id: str
    state_dir: Path  # searchable by the libvirt-qemu user, removed after the session

    def workload_id(self, name: str) -> str:
        return f"t{self.run_id}-{name}"


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 300) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _kernel_package() -> str:
    out = _run(["apt-cache", "depends", "linux-image-amd64"])
    for line in out.splitlines():
        m = re.match(r"\s*Depends:\s*(linux-image-\S+-amd64)\s*$", line)
        if m:
            return m.group(1)
    raise RuntimeError(f"cannot find the kernel package behind linux-image-amd64:\n{out}")


def _modinfo_depends(ko: Path) -> list[str]:
    m = re.search(rb"(?:^|\x00)depends=([^\x00]*)\x00", ko.read_bytes())
    return [d for d in m.group(1).decode().split(",") if d] if m else []


def _module_order(mod_root: Path, wanted: tuple[str, ...]) -> list[Path]:
    """Modules to insmod, dependencies first (what depmod + modprobe would do)."""
    index = {p.name.removesuffix(".ko"): p for p in mod_root.rglob("*.ko")}
    order: list[Path] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        if name not in index:
            raise RuntimeError(f"module {name} not found under {mod_root}")
        for dep in _modinfo_depends(index[name]):
            visit(dep)
        order.append(index[name])

    for name in wanted:
        visit(name)
    return order


def _cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive (what the kernel unpacks as initramfs), without needing cpio(1)."""
    out = bytearray()

    def add(name: str, mode: int, data: bytes, ino: int) -> None:
        nb = name.encode() + b"\x00"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0]
        out.extend(b"070701" + "".join(f"{v:08x}" for v in fields).encode() + nb)
        out.extend(b"\x00" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\x00" * (-len(out) % 4))

    for ino, (name, mode, data) in enumerate(entries, start=1):
        add(name, mode, data, ino)
    add("TRAILER!!!", 0, b"", 0)
    return bytes(out)


def _extract_vmlinux(bzimage: Path, dest: Path) -> None:
    data = bzimage.read_bytes()
    start = data.find(b"\xfd7zXZ\x00")
    if start < 0:
        raise RuntimeError(f"{bzimage}: no XZ payload found")
    # The payload is followed by padding and trailer bytes that the decompressor just ignores.
    dest.write_bytes(lzma.LZMADecompressor().decompress(data[start:]))


def _build_initrd(mod_root: Path, dest: Path) -> None:
    busybox = Path("/bin/busybox")
    # A dynamic busybox names its ELF interpreter; the initramfs has no libc for it.
    if not busybox.exists() or b"/ld-linux" in busybox.read_bytes():
        raise RuntimeError("a static /bin/busybox is needed (apt-get install busybox-static)")
    entries: list[tuple[str, int, bytes]] = []
    for d in ("bin", "dev", "proc", "sys", "seed", "lib", "lib/modules"):
        entries.append((d, stat.S_IFDIR | 0o755, b""))
    entries.append(("bin/busybox", stat.S_IFREG | 0o755, busybox.read_bytes()))
    entries.append(("init", stat.S_IFREG | 0o755, INIT_SCRIPT.encode()))
    entries.append(("bin/dhcp-event", stat.S_IFREG | 0o755, DHCP_SCRIPT.encode()))
    modules = _module_order(mod_root, WANTED_MODULES)
    for ko in modules:
        entries.append((f"lib/modules/{ko.name}", stat.S_IFREG | 0o644, ko.read_bytes()))
    order = "\n".join(ko.name.removesuffix(".ko") for ko in modules) + "\n"
    entries.append(("lib/modules/order", stat.S_IFREG | 0o644, order.encode()))
    # Uncompressed: gunzip under TCG costs more than reading a few extra MB.
    dest.write_bytes(_cpio_newc(entries))


def _build_base_disk(dest: Path) -> None:
    raw = dest.with_suffix(".raw")
    with open(raw, "wb") as f:
        f.write(BASE_MARKER.encode().ljust(512, b"\x00"))
        f.truncate(8 * 1024 * 1024)
    _run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(dest)])
    raw.unlink()


def build_test_guest(cache_dir: Path = CACHE_DIR) -> TestGuest:
    """Build (or reuse) the tiny guest. Safe against concurrent sessions: built in a temp dir and
    renamed into place."""
    final = cache_dir / f"v{GUEST_VERSION}"
    stamp = final / "kernel-version"
    if not stamp.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".build-"))
        try:
            pkg = _kernel_package()
            _run(["apt-get", "download", pkg], cwd=work)
            deb = next(work.glob("linux-image-*.deb"))
            _run(["dpkg-deb", "-x", str(deb), str(work / "x")])
            vmlinuz = next((work / "x" / "boot").glob("vmlinuz-*"))
            version = vmlinuz.name.removeprefix("vmlinuz-")
            out = work / "out"
            out.mkdir()
            _extract_vmlinux(vmlinuz, out / "vmlinux")
            _build_initrd(work / "x" / "lib" / "modules" / version, out / "initrd.img")
            _build_base_disk(out / "base.qcow2")
            (out / "kernel-version").write_text(version)
            for p in (out, *out.iterdir()):
                p.chmod(0o755 if p.is_dir() else 0o644)
            try:
                out.rename(final)
            except OSError:
                if not stamp.exists():  # lost a race to another session only if it finished
                    raise
            for old in cache_dir.glob("v*"):
                if old != final:
                    shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return TestGuest(
        kernel=final / "vmlinux",
        initrd=final / "initrd.img",
        base_disk=final / "base.qcow2",
        kernel_version=stamp.read_text().strip(),
    )


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _missing_binaries() -> list[str]:
    need = ("qemu-system-x86_64", "qemu-img", "virsh", "libvirtd", "virtlogd")
    return [b for b in need if shutil.which(b, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]


def cleanup_domains(uri: str, needle: str) -> None:
    """Remove the domains whose names hold `needle` (what a test or a crashed run left behind)."""
    names = subprocess.run(
        ["virsh", "-c", uri, "list", "--all", "--name"], capture_output=True, text=True, timeout=30, check=False
    ).stdout.split()
    for name in names:
        if needle in name:
            subprocess.run(["virsh", "-c", uri, "destroy", name], capture_output=True, timeout=30, check=False)
            subprocess.run(["virsh", "-c", uri, "undefine", name], capture_output=True, timeout=30, check=False)
            Path(f"/var/log/libvirt/qemu/{name}.log").unlink(missing_ok=True)


if pytest is not None:  # fixtures only where pytest runs
    @pytest.fixture(scope="session")
    def vm_host() -> Iterator[VMHost]:
        missing = _missing_binaries()
        if missing:
            pytest.skip(
                f"QEMU/libvirt not installed (missing {', '.join(missing)}; "
                "apt-get install qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-clients)"
            )
        proc = subprocess.run(["bash", str(START_LIBVIRTD)], capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            pytest.fail(f"scripts/start-libvirtd.sh failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}")
        run_id = uuid.uuid4().hex[:8]
        # Not under pytest's tmp dir: that is mode 0700, and QEMU (user libvirt-qemu) must reach the disks.
        state_dir = Path(tempfile.mkdtemp(dir="/var/tmp", prefix=f"persys-vm-test-{run_id}-"))
        state_dir.chmod(0o755)
        uri = "qemu:///system"
        try:
            yield VMHost(uri=uri, run_id=run_id, state_dir=state_dir)
        finally:
            cleanup_domains(uri, f"t{run_id}-")
            shutil.rmtree(state_dir, ignore_errors=True)


    @pytest.fixture(scope="session")
    def test_guest(vm_host: VMHost) -> TestGuest:
        try:
            return build_test_guest()
        except (RuntimeError, subprocess.TimeoutExpired, StopIteration) as exc:
            pytest.fail(f"building the test guest failed: {exc}")


if __name__ == "__main__":
    # Build (or reuse) the tiny guest and print where it is: examples/hello-vm.yaml uses it.
    g = build_test_guest()
    print(f"kernel {g.kernel}\ninitrd {g.initrd}\ndisk   {g.base_disk}")


def linked_into(src: Path, where: Path, name: str = "") -> Path:
    """`src` hard-linked into `where` (as `name`, else its own name), copied across file systems."""
    dest = where / (name or src.name)
    if not dest.exists():
        try:
            os.link(src, dest)
        except OSError:
            shutil.copy2(src, dest)
    return dest


def dev_cluster_id(home: Path) -> str:
    """The cluster id of the `persys dev` run with PERSYS_HOME=home (from its CA, made at start):
    what it names its volumes on shared backends with (security.cluster_id)."""
    from persys.security.cluster_id import cluster_id_of_file

    return cluster_id_of_file(home / "dev" / "pki" / "ca.crt")


def dev_home(prefix: str, guest: TestGuest) -> tuple[Path, dict[str, str], tuple[Path, Path, Path]]:
    """A PERSYS_HOME for `persys dev` outside pytest's tmp dir (0700: QEMU runs as libvirt-qemu and
    must reach the VM's files), with the guest's kernel, initrd and disk linked under the node
    paths it serves: the home, its environment and those three paths."""
    home = Path(tempfile.mkdtemp(dir="/var/tmp", prefix=prefix))
    home.chmod(0o755)
    images = home / "dev" / "images"
    images.mkdir(parents=True)
    kernel, initrd, disk = (linked_into(p, images) for p in (guest.kernel, guest.initrd, guest.base_disk))
    return home, {"PERSYS_HOME": str(home)}, (kernel, initrd, disk)
