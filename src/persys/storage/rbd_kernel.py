"""Whether this node could map an RBD image as a block device (kernel rbd, or rbd-nbd over the nbd
driver): what a FILESYSTEM attachment of a ceph-rbd volume needs. Looked up on the node each time."""

from __future__ import annotations

import shutil
from pathlib import Path

SYS = Path("/sys")


def kernel_map_missing(sys_root: Path = SYS) -> str:
    """Why ceph-rbd volumes cannot be mounted as filesystems here (never empty: the driver's map,
    mkfs and mount path is not built yet, so even a kernel with rbd gets VM disks only)."""
    krbd = (sys_root / "bus" / "rbd" / "add").exists()
    nbd = any((sys_root / "block").glob("nbd*")) and shutil.which("rbd-nbd") is not None
    if krbd or nbd:
        return ("kernel RBD/NBD present, but ceph-rbd's filesystem path (map, mkfs, mount) is not built "
                "yet: ceph-rbd offered for VM disks only")
    return ("no kernel RBD or NBD: ceph-rbd offered for VM disks only (no /sys/bus/rbd: the kernel "
            "lacks CONFIG_BLK_DEV_RBD; no /sys/block/nbd*: it lacks CONFIG_BLK_DEV_NBD for rbd-nbd)")
