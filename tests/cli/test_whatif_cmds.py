"""persysctl's what-if helpers (pure): one operation at a time, node files, and `plan -f` seeing
the Volumes declared in the same file."""

from __future__ import annotations

from pathlib import Path

import pytest

from persys.cli.ctl import whatif_cmds
from persys.cli.ctl.api import CtlError
from persys.model.kinds import parse_documents
from persys.model.manifest import load_documents, validate_manifest

FILE = """
apiVersion: persys.dev/v1
kind: Volume
metadata: {name: disk}
spec: {driver: ceph-rbd, sizeMb: 1024}
---
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: vm}
spec:
  type: vm
  vm: {image: debian-base}
  volumes:
    - {name: data, claim: disk, mountPath: /data}
    - {name: scratch, claim: elsewhere, mountPath: /scratch}
"""


def test_plan_sees_volumes_declared_in_the_same_file() -> None:
    found = parse_documents(load_documents(FILE, "f.yaml"), "f.yaml")
    (w,) = found.workloads
    doc = w.model_dump(mode="json", by_alias=True, exclude_unset=True)
    planned = whatif_cmds.with_declared_volumes(doc, found.volumes)
    data, scratch = planned["spec"]["volumes"]
    assert data == {"name": "data", "driver": "ceph-rbd", "sizeMb": 1024, "mountPath": "/data"}
    assert scratch == {"name": "scratch", "claim": "elsewhere", "mountPath": "/scratch"}  # in the cluster, or not
    validate_manifest(planned)  # what the gateway checks before planning
    assert doc["spec"]["volumes"][0]["claim"] == "disk"  # the manifest applied is left as written
    assert whatif_cmds.with_declared_volumes(doc, []) is doc


def test_operation_documents(tmp_path: Path) -> None:
    assert whatif_cmds.operation_doc([], [], [], "", None) is None
    assert whatif_cmds.operation_doc(["n1"], [], [], "", None) == {"kind": "drain", "nodes": ["n1"]}
    assert whatif_cmds.operation_doc([], [], [], "zone=a", None) == {"kind": "lose-label", "label": "zone=a"}
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("nodes:\n  - {name: n9, cpuMillicores: 8000}\n")
    assert whatif_cmds.operation_doc([], [], [], "", nodes) == {
        "kind": "add-node", "nodes": [{"name": "n9", "cpuMillicores": 8000}]}
    with pytest.raises(CtlError, match="one operation at a time: --drain, --cordon"):
        whatif_cmds.operation_doc(["n1"], ["n2"], [], "", None)
    with pytest.raises(CtlError, match="key=value"):
        whatif_cmds.operation_doc([], [], [], "zone", None)
