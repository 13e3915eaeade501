"""`persys dev --nodes FILE` with per-node storage (pure parsing): simulated drivers as the
example file gives them, and a bad section named with its node and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from persys.cli.servers.dev_cmd import dev_nodes
from persys.cli.servers.errors import ServerError
from persys.storage.base import AttachKind

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dev-storage-nodes.yaml"


def test_the_example_simulates_storage_per_node() -> None:
    ceph, nfs = dev_nodes(EXAMPLE)
    assert ceph.storage is not None and ceph.storage.simulate["ceph-rbd"] == {AttachKind.VM_DISK}
    assert nfs.storage is not None and nfs.storage.simulate["nfs"] == {AttachKind.FILESYSTEM, AttachKind.VM_DISK}


def test_a_bad_storage_section_names_node_and_field(tmp_path: Path) -> None:
    f = tmp_path / "nodes.yaml"
    f.write_text("nodes:\n  - name: a\n    storage: {simulate: {ceph-rbd: [tape]}}\n")
    with pytest.raises(ServerError, match=r"nodes\[0\]\.storage\.simulate\.ceph-rbd"):
        dev_nodes(f)


def test_runtimes_and_disk_per_node(tmp_path: Path) -> None:
    f = tmp_path / "nodes.yaml"
    f.write_text("nodes:\n  - {name: a, runtimes: [process], diskMb: 2048}\n  - {name: b}\n")
    a, b = dev_nodes(f)
    assert (a.runtimes, a.disk_mb) == (("process",), 2048) and (b.runtimes, b.disk_mb) == ((), 0)
    f.write_text("nodes:\n  - {name: a, runtimes: [gpu]}\n")
    with pytest.raises(ServerError, match=r"nodes\[0\]\.runtimes: a list among container"):
        dev_nodes(f)
    f.write_text("nodes:\n  - {name: a, diskMb: -1}\n")
    with pytest.raises(ServerError, match=r"nodes\[0\]\.diskMb"):
        dev_nodes(f)


def test_simulated_devices_per_node(tmp_path: Path) -> None:
    f = tmp_path / "nodes.yaml"
    f.write_text("nodes:\n  - name: a\n    devices: [{id: GPU-1, vendor: nvidia, model: T4, memoryMb: 15360}]\n"
                 "  - {name: b, devices: []}\n  - {name: c}\n")
    a, b, c = dev_nodes(f)
    assert a.devices is not None and [(d.id, d.vendor, d.memory_mb) for d in a.devices] == [("GPU-1", "nvidia", 15360)]
    assert b.devices == [] and c.devices is None  # none at all; the host's, detected
    f.write_text("nodes:\n  - name: a\n    devices: [{id: GPU-1, vendor: NVIDIA!}]\n")
    with pytest.raises(ServerError, match=r"nodes\[0\]\.devices\[0\]\.vendor: String should match pattern"):
        dev_nodes(f)
