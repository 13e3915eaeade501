"""The node's storage as the agent runs it: drivers built from `persys agent --storage FILE`,
probed for real at start, and what the node advertises from the probes (a driver name and
"<driver>:<kind>" per working attach kind, and why each missing one is missing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from persys.storage.base import AttachKind, VolumeDriver
from persys.storage.ceph_open import open_ceph
from persys.storage.config import StorageConfig
from persys.storage.probe import DriverReport, build_drivers

KIND_ORDER = (AttachKind.FILESYSTEM, AttachKind.VM_DISK)


def open_drivers(config: StorageConfig | None, node_id: str, cluster_id: str = "") -> dict[str, VolumeDriver | str]:
    """Driver name -> its instance, or why it could not be built; nothing configured: empty."""
    if config is None:
        return {}
    return build_drivers(config, node_id, ceph=open_ceph, cluster_id=cluster_id)


def usable(drivers: Mapping[str, VolumeDriver | str]) -> dict[str, VolumeDriver]:
    return {k: v for k, v in drivers.items() if not isinstance(v, str)}


def advertised(reports: Sequence[DriverReport]) -> tuple[list[str], dict[str, str]]:
    """(storage_drivers, storage_missing) for the node's registration (pure)."""
    entries: list[str] = []
    missing: dict[str, str] = {}
    for r in reports:
        if r.kinds:
            entries.append(r.driver)
            entries += [f"{r.driver}:{k.value}" for k in KIND_ORDER if k in r.kinds]
        else:
            missing[r.driver] = r.reason or "unusable"
        for k in KIND_ORDER:
            if k not in r.kinds and r.kinds and k in r.missing:
                missing[f"{r.driver}:{k.value}"] = r.missing[k]
    return entries, missing
