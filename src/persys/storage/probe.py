"""What a node's storage offers: every configured driver probed for real (through
`VolumeDriver.probe()` only, each bounded by a timeout), the list the agent advertises, and the
pure explanation of a placement refusal ("node a: ceph-rbd offered for VM disks only").

Every driver name appears in the list: a driver that is not configured, could not be built, or
whose probe failed or hung is present with no kinds and the reason."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from persys.storage.base import AttachKind, Capability, StorageError, VolumeDriver
from persys.storage.config import DRIVERS, CephConfig, StorageConfig
from persys.storage.local import LocalDriver
from persys.storage.nfs import NfsDriver
from persys.storage.nfs_export import NfsExport

DEFAULT_PROBE_TIMEOUT = 60.0
KIND_WORDS = {AttachKind.FILESYSTEM: "filesystems", AttachKind.VM_DISK: "VM disks"}
_KINDS_ORDER = (AttachKind.FILESYSTEM, AttachKind.VM_DISK)


@dataclass(frozen=True, slots=True)
class DriverReport:
    """One driver on one node: the attach kinds that work, why the others do not; `reason` says
    why the driver as a whole is absent or broken (not configured, probe failed or hung)."""

    driver: str
    kinds: frozenset[AttachKind] = frozenset()
    missing: Mapping[AttachKind, str] = field(default_factory=dict)
    reason: str = ""
    configured: bool = True
    block: bool = False

    @property
    def usable(self) -> bool:
        return bool(self.kinds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "kinds": [k.value for k in _KINDS_ORDER if k in self.kinds],
            "missing": {k.value: self.missing[k] for k in _KINDS_ORDER if k in self.missing},
            "reason": self.reason,
            "configured": self.configured,
            "block": self.block,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DriverReport:
        return cls(str(raw["driver"]), frozenset(AttachKind(k) for k in raw.get("kinds", ())),
                   {AttachKind(k): str(v) for k, v in dict(raw.get("missing", {})).items()},
                   str(raw.get("reason", "")), bool(raw.get("configured", True)), bool(raw.get("block", False)))


def _absent(driver: str, reason: str, *, configured: bool) -> DriverReport:
    return DriverReport(driver, frozenset(), {k: reason for k in _KINDS_ORDER}, reason, configured)


def _from_capability(cap: Capability) -> DriverReport:
    missing = {k: cap.missing.get(k, "not offered by the driver") for k in _KINDS_ORDER if k not in cap.kinds}
    reason = "" if cap.kinds else "; ".join(dict.fromkeys(missing.values()))
    return DriverReport(cap.driver, frozenset(cap.kinds), missing, reason, True, cap.block)


def _bounded_probe(driver: VolumeDriver, timeout: float) -> Callable[[float], DriverReport]:
    """Start `driver.probe()` in a daemon thread (a hung probe must not keep the agent from
    exiting); the returned callable waits for it until the shared deadline."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["cap"] = driver.probe()
        except Exception as e:  # a driver's bug, too, is reported as its probe failing
            box["err"] = e

    thread = threading.Thread(target=work, name=f"probe-{driver.name}", daemon=True)
    thread.start()

    def result(deadline_left: float) -> DriverReport:
        thread.join(max(0.0, deadline_left))
        if thread.is_alive():
            return _absent(driver.name, f"probe did not answer within {timeout:.0f} s", configured=True)
        if "err" in box:
            return _absent(driver.name, f"probe failed: {box['err']}", configured=True)
        return _from_capability(box["cap"])

    return result


def probe_drivers(drivers: Mapping[str, VolumeDriver | str], *,
                  timeout: float = DEFAULT_PROBE_TIMEOUT) -> list[DriverReport]:
    """Probe every configured driver at once. `drivers` maps a driver name to its instance, or to
    the reason it could not be built; a name that is absent is reported as not configured."""
    deadline = time.monotonic() + timeout
    waits: dict[str, Callable[[float], DriverReport]] = {}
    reports: dict[str, DriverReport] = {}
    for name in DRIVERS:
        entry = drivers.get(name)
        if entry is None:
            reports[name] = _absent(name, f"{name} not configured", configured=False)
        elif isinstance(entry, str):
            reports[name] = _absent(name, entry, configured=True)
        else:
            waits[name] = _bounded_probe(entry, timeout)
    for name, wait in waits.items():
        reports[name] = wait(deadline - time.monotonic())
    return [reports[name] for name in DRIVERS]


def simulated_reports(config: StorageConfig) -> list[DriverReport]:
    """What a `persys dev --nodes` node advertises from its `simulate:` section, without probing."""
    out = []
    for name in DRIVERS:
        kinds = config.simulate.get(name)
        if kinds is None:
            out.append(_absent(name, f"{name} not configured", configured=False))
            continue
        missing = {k: "not in this simulated node's storage" for k in _KINDS_ORDER if k not in kinds}
        out.append(DriverReport(name, kinds, missing, "" if kinds else "simulated without attach kinds", True,
                                AttachKind.VM_DISK in kinds))
    return out


def build_drivers(config: StorageConfig, node_id: str, *,
                  ceph: Callable[[CephConfig, str, str], VolumeDriver] | None = None,
                  cluster_id: str = "") -> dict[str, VolumeDriver | str]:
    """The node's drivers from its configuration (what `probe_drivers` takes). The ceph-rbd driver
    comes from `ceph` (its module is built apart); without it a configured ceph-rbd is absent.
    `cluster_id`: the local pool's images (and their loop devices) live in the cluster's folder, the
    nfs volumes in the cluster's folder on the export (and mounts under the cluster's mount root),
    the ceph-rbd images under names carrying it: the scheduler's volume controller and the agents
    of one cluster must be given the same."""
    out: dict[str, VolumeDriver | str] = {}
    if config.local is not None:
        out["local"] = LocalDriver(Path(config.local.pool), node_id, cluster_id=cluster_id)
    if config.nfs is not None:
        exp = NfsExport(config.nfs.server, config.nfs.export, config.nfs.port)
        out["nfs"] = NfsDriver(exp, node_id, mount_root=config.nfs.mount_root, cluster_id=cluster_id)
    if config.ceph is not None:
        try:
            out["ceph-rbd"] = ceph(config.ceph, node_id, cluster_id) if ceph \
                else "ceph-rbd driver not available in this agent"
        except StorageError as e:
            out["ceph-rbd"] = f"ceph-rbd driver could not start: {e}"
    return out


def _words(kinds: Sequence[AttachKind] | frozenset[AttachKind]) -> str:
    return " and ".join(KIND_WORDS[k] for k in _KINDS_ORDER if k in kinds)


def explain_refusal(node: str, reports: Sequence[DriverReport], driver: str, kind: AttachKind) -> str:
    """'' when `node` offers `driver` as `kind`; else why not, in one line for placement."""
    found = next((r for r in reports if r.driver == driver), None)
    if found is None or not found.configured:
        return f"node {node}: {driver} not configured"
    if kind in found.kinds:
        return ""
    why = found.missing.get(kind) or found.reason
    if not found.kinds:
        return f"node {node}: {driver} unusable ({why})" if why else f"node {node}: {driver} unusable"
    offered = f"{driver} offered for {_words(found.kinds)} only"
    why = why.removesuffix(f": {offered}")  # a probe reason may end in the same words
    return f"node {node}: {offered} ({why})" if why else f"node {node}: {offered}"
