"""Node storage probing (persys.storage.probe) and its configuration (persys.storage.config):
the pure parts table-driven from config_cases.yaml and refusal_cases.yaml; the probing with a real
`local` pool, and with drivers whose probe hangs or breaks."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from persys.storage.base import AttachKind, Capability
from persys.storage.config import StorageConfig, StorageConfigError, load_storage_config, parse_storage_config
from persys.storage.local import LocalDriver
from persys.storage.probe import (
    DriverReport,
    build_drivers,
    explain_refusal,
    probe_drivers,
    simulated_reports,
)
from tests.cases import load

HERE = Path(__file__).parent
CONFIG_CASES: list[dict[str, Any]] = load(__file__, "config_cases.yaml")
REFUSAL_CASES: list[dict[str, Any]] = load(__file__, "refusal_cases.yaml")


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(v.value for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[c["name"] for c in CONFIG_CASES])
def test_config(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(StorageConfigError) as err:
            parse_storage_config(case["raw"])
        assert err.value.field == case["error"] and str(err.value).startswith(case["error"] + ": ")
        return
    cfg = parse_storage_config(case["raw"])
    expect = case["expect"]
    assert cfg.configured() == expect["configured"]
    for section in ("local", "nfs", "ceph", "rgw"):
        for key, want in expect.get(section, {}).items():
            assert _plain(asdict(getattr(cfg, section))[key]) == want, f"{section}.{key}"
    if "simulate" in expect:
        assert _plain(dict(cfg.simulate)) == expect["simulate"]


def test_config_from_yaml_refuses_aliases() -> None:
    assert load_storage_config("nfs: {server: a, export: /x, port: 2050}\n").nfs is not None
    with pytest.raises(StorageConfigError, match=r"^storage: not a valid document"):
        load_storage_config("a: &x {pool: /p}\nlocal: *x\n")


@pytest.mark.parametrize("case", REFUSAL_CASES, ids=[c["name"] for c in REFUSAL_CASES])
def test_refusal(case: dict[str, Any]) -> None:
    reports = [DriverReport.from_dict(r) for r in case["reports"]]
    assert [DriverReport.from_dict(r.to_dict()) for r in reports] == reports  # the wire form round-trips
    driver, kind = case["need"]
    assert explain_refusal(case["node"], reports, driver, AttachKind(kind)) == case["expect"]


class _Stuck:
    """A driver whose probe never returns (an unreachable monitor without a client timeout)."""

    name = "ceph-rbd"
    node_id = "n1"

    def __init__(self) -> None:
        self.release = threading.Event()

    def probe(self) -> Capability:
        self.release.wait(30)
        return Capability(self.name, frozenset())


class _Broken:
    name = "nfs"
    node_id = "n1"

    def probe(self) -> Capability:
        raise RuntimeError("libnfs exploded")


def test_probing_a_real_local_pool_and_a_broken_driver(loop_pool: Path) -> None:
    drivers: dict[str, Any] = {"local": LocalDriver(loop_pool / "pool", "n1"), "nfs": _Broken()}
    reports = {r.driver: r for r in probe_drivers(drivers, timeout=60)}  # returns when both answered
    assert reports["local"].kinds == {AttachKind.FILESYSTEM, AttachKind.VM_DISK} and reports["local"].block
    assert reports["nfs"].reason == "probe failed: libnfs exploded" and reports["nfs"].configured


def test_a_hung_probe_is_bounded_and_reported() -> None:
    stuck = _Stuck()
    t0 = time.monotonic()
    reports = {r.driver: r for r in probe_drivers({"ceph-rbd": stuck}, timeout=1)}  # type: ignore[dict-item]
    stuck.release.set()
    assert time.monotonic() - t0 < 10  # bounded by the timeout, not by the hung probe (30 s)
    assert reports["ceph-rbd"].reason == "probe did not answer within 1 s" and not reports["ceph-rbd"].usable
    assert explain_refusal("n1", list(reports.values()), "ceph-rbd", AttachKind.VM_DISK) == \
        "node n1: ceph-rbd unusable (probe did not answer within 1 s)"


def test_unconfigured_and_unbuildable_drivers_are_listed_with_the_reason(tmp_path: Path) -> None:
    cfg = parse_storage_config({"nfs": {"server": "127.0.0.1", "export": "/export", "port": 1,
                                        "mountRoot": str(tmp_path)},
                                "ceph-rbd": {"monitors": ["127.0.0.1:3300"], "pool": "rbd", "user": "persys",
                                             "secretName": "ceph"}})
    drivers = build_drivers(cfg, "n1")  # no ceph-rbd factory given
    assert drivers["ceph-rbd"] == "ceph-rbd driver not available in this agent"
    reports = {r.driver: r for r in probe_drivers(drivers, timeout=20)}
    assert [r for r in reports] == ["local", "nfs", "ceph-rbd"]
    assert not reports["local"].configured and reports["local"].reason == "local not configured"
    assert not reports["nfs"].usable and "unreachable" in reports["nfs"].reason
    assert reports["ceph-rbd"].configured and not reports["ceph-rbd"].usable


def test_simulated_node_advertises_without_probing() -> None:
    reports = {r.driver: r for r in simulated_reports(StorageConfig(simulate={"ceph-rbd": frozenset({
        AttachKind.VM_DISK})}))}
    assert reports["ceph-rbd"].kinds == {AttachKind.VM_DISK} and reports["ceph-rbd"].block
    assert explain_refusal("sim", list(reports.values()), "ceph-rbd", AttachKind.FILESYSTEM) == \
        "node sim: ceph-rbd offered for VM disks only (not in this simulated node's storage)"
    assert explain_refusal("sim", list(reports.values()), "nfs", AttachKind.VM_DISK) == "node sim: nfs not configured"
