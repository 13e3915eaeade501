"""cloud-init NoCloud seeds: an ISO9660 volume labelled `cidata` with user-data and meta-data.

Built in pure Python with pycdlib, so the agent needs neither genisoimage nor cloud-localds.
Plain ISO9660 only allows 8.3 upper-case names, so the exact names cloud-init looks for
(`user-data`, `meta-data`, ...) come from Rock Ridge (what Linux mounts) and Joliet (what
Windows guests such as cloudbase-init read).
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import yaml

from persys.model.vm_spec import CloudInit

VOLUME_ID = "cidata"

# Exact cloud-init file name -> a unique ISO9660 level-1 name (only seen by readers without RR/Joliet).
_ISO_NAMES = {
    "user-data": "USERDATA.;1",
    "meta-data": "METADATA.;1",
    "network-config": "NETCONF.;1",
    "vendor-data": "VENDDATA.;1",
}


class SeedError(Exception):
    pass


def hostname_for(workload_id: str) -> str:
    """A valid single-label hostname: replica ids contain '.', which would make it an FQDN."""
    host = re.sub(r"[^a-z0-9-]", "-", workload_id.lower()).strip("-")[:63].rstrip("-")
    return host or "persys-vm"


def seed_files(workload_id: str, revision: str, ci: CloudInit) -> dict[str, bytes]:
    """The seed's files. The instance-id changes with the revision, so cloud-init treats a new
    revision as a new instance and runs its per-instance modules (users, keys, runcmd) again."""
    meta: dict[str, object] = {"instance-id": f"{workload_id}-{revision}", "local-hostname": hostname_for(workload_id)}
    if ci.meta_data.strip():
        extra = yaml.safe_load(ci.meta_data)
        if not isinstance(extra, dict):
            raise SeedError("cloudInit.metaData must be a YAML mapping")
        meta.update(extra)
    files = {
        # NoCloud requires both files to exist, even when user-data is empty.
        "user-data": ci.user_data.encode(),
        "meta-data": yaml.safe_dump(meta, sort_keys=False).encode(),
    }
    if ci.network_config.strip():
        files["network-config"] = ci.network_config.encode()
    if ci.vendor_data.strip():
        files["vendor-data"] = ci.vendor_data.encode()
    return files


def write_seed_iso(path: Path, files: dict[str, bytes]) -> None:
    """Write the ISO atomically (a half-written seed must never be attached to a VM)."""
    try:
        import pycdlib
    except ImportError as exc:  # optional at import time so the agent still runs without VMs
        raise SeedError("the pycdlib package is required for cloud-init seeds (pip install pycdlib)") from exc
    unknown = set(files) - set(_ISO_NAMES)
    if unknown:
        raise SeedError(f"unsupported seed files: {', '.join(sorted(unknown))}")
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=1, vol_ident=VOLUME_ID, joliet=3, rock_ridge="1.09")
    for name, data in files.items():
        iso.add_fp(io.BytesIO(data), len(data), f"/{_ISO_NAMES[name]}", rr_name=name, joliet_path=f"/{name}")
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            iso.write_fp(f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        iso.close()
        tmp.unlink(missing_ok=True)


def build_seed(path: Path, workload_id: str, revision: str, ci: CloudInit) -> dict[str, bytes]:
    files = seed_files(workload_id, revision, ci)
    write_seed_iso(path, files)
    return files


def read_seed_iso(path: Path) -> tuple[str, dict[str, bytes]]:
    """(volume id, files by Rock Ridge name): what a Linux guest sees when it mounts the seed."""
    import pycdlib

    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    try:
        vol = iso.pvd.volume_identifier.decode().strip()
        out: dict[str, bytes] = {}
        for child in iso.list_children(rr_path="/"):
            if child is None or child.is_dot() or child.is_dotdot():
                continue
            name = child.rock_ridge.name().decode()
            buf = io.BytesIO()
            iso.get_file_from_iso_fp(buf, rr_path=f"/{name}")
            out[name] = buf.getvalue()
        return vol, out
    finally:
        iso.close()
