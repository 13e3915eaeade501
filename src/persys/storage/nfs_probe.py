"""The `nfs` driver's probe: the export reachable and writable (libnfs), a disk image QEMU's own
NFS client can create there (VM_DISK), and a kernel NFSv4 mount of it (FILESYSTEM), each really
tried; what fails is reported with its reason and the fix."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from persys.storage import ext4_images as img
from persys.storage import libnfs
from persys.storage import nfs_export as ex
from persys.storage import node_mounts as nm
from persys.storage.base import AttachKind, Capability, StorageError
from persys.storage.commands import CommandFailed, run


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    name: str
    export: ex.NfsExport
    node_id: str
    mount_root: Path
    timeout: float
    root: str = ex.ROOT  # the cluster's folder on the export (nfs_export.Layout): probes stay in it

NO_KERNEL_CLIENT = "no kernel NFS client (nfs4 not in /proc/filesystems): nfs offered for VM disks only"


def kernel_client_missing(filesystems: str | None = None) -> str:
    """'' when the kernel can mount NFSv4, else why not (built-in or a loaded module shows in
    /proc/filesystems; a kernel without loadable modules cannot gain it)."""
    text = filesystems if filesystems is not None else Path("/proc/filesystems").read_text()
    names = {line.split()[-1] for line in text.splitlines() if line.strip()}
    if "nfs4" in names:
        return ""
    return NO_KERNEL_CLIENT


def qemu_reason(err: StorageError, export: ex.NfsExport) -> str:
    """Why QEMU's NFS client cannot use the export, with the fix."""
    text = str(err)
    if "missing on this node" in text:
        return "qemu-img missing (install qemu-utils): QEMU's NFS client cannot be tried"
    if "Unknown protocol 'nfs'" in text or "block-nfs not found" in text:
        return "QEMU lacks its nfs block driver (install qemu-block-extra)"
    if isinstance(err, CommandFailed) and "mount" in err.output:
        return (f"QEMU's NFS client cannot mount {export.server}:{export.base}: it speaks NFSv3 through the "
                f"server's portmapper (rpcbind, port 111), so the server must serve NFSv3 too ({err.output[:200]})")
    return f"QEMU's NFS client failed on {export}: {text}"


def _try_qemu(driver: ProbeTarget, s: libnfs.NfsSession) -> str:
    probe = f"{driver.root}/.probe-{driver.node_id}.img"
    s.unlink(probe)
    try:
        run(["qemu-img", "create", "-q", "-f", "raw", driver.export.qemu_url(probe), "1M"], timeout=driver.timeout)
    except StorageError as e:
        return qemu_reason(e, driver.export)
    finally:
        s.unlink(probe)
    return ""


def _try_kernel_mount(driver: ProbeTarget) -> str:
    """Mount the export's persys folder, write a file, unmount (nodes with a kernel NFS client)."""
    reason = kernel_client_missing()
    if reason:
        return reason
    if shutil.which("mount.nfs4") is None:
        return "mount.nfs4 missing (install nfs-common)"
    mnt = driver.mount_root / ".probe"
    try:
        if nm.mount_at(mnt) is not None:  # left by a crashed probe
            nm.unmount(mnt, driver.timeout)
        img.ensure_dir(mnt)
        opts = f"port={driver.export.port},nosuid,nodev,soft,timeo={max(10, int(driver.timeout * 10))}"
        run(["mount", "-t", "nfs4", "-o", opts, driver.export.kernel_source(driver.root), str(mnt)],
            timeout=driver.timeout)
        try:
            probe = mnt / f".probe-{driver.node_id}"
            probe.write_bytes(b"persys")
            probe.unlink()
        finally:
            nm.unmount(mnt, driver.timeout)
    except (StorageError, OSError) as e:
        return f"kernel NFSv4 mount of {driver.export} failed: {e}"
    finally:
        with contextlib.suppress(OSError):
            mnt.rmdir()
    return ""


def probe_export(driver: ProbeTarget) -> Capability:
    timeout = driver.timeout
    both = (AttachKind.FILESYSTEM, AttachKind.VM_DISK)
    try:
        with libnfs.session(driver.export.libnfs_url, timeout) as s:
            s.mkdir(ex.ROOT)
            s.mkdir(driver.root)
            s.mkdir(f"{driver.root}/.attach")
            check = f"{driver.root}/.probe-{driver.node_id}"
            s.touch(check)
            s.unlink(check)
            missing = {AttachKind.VM_DISK: _try_qemu(driver, s)}
    except StorageError as e:
        return Capability(driver.name, frozenset(), {k: f"export not usable: {e}" for k in both})
    missing[AttachKind.FILESYSTEM] = _try_kernel_mount(driver)
    missing = {k: v for k, v in missing.items() if v}
    return Capability(driver.name, frozenset(k for k in both if k not in missing), missing,
                      block=AttachKind.VM_DISK not in missing)
