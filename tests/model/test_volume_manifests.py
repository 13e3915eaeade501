"""`kind: Volume` manifests: what the model accepts, and each refusal naming its field
(cases in volume_cases/manifests.yaml); claims in workloads; mixed files by kind."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from persys.model import parse_manifests
from persys.model.kinds import parse_all, validate_volume
from persys.model.manifest import ManifestError
from persys.model.volume import ReclaimPolicy, VolumeAccess, inline_spec, inline_volume_id
from persys.model.workload import VolumeSpec
from tests.cases import load

CASES = load(__file__, "volume_cases/manifests.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_volume_manifest(case: dict[str, Any]) -> None:
    doc = {"apiVersion": "persys.dev/v1", "kind": "Volume", "metadata": {"name": "vol"}, "spec": case["spec"]}
    if case.get("ok"):
        assert validate_volume(doc).spec.driver == case["spec"]["driver"]
        return
    with pytest.raises(ManifestError) as exc:
        validate_volume(doc)
    assert any(case["problem"] in p for p in exc.value.problems), exc.value.problems


def test_a_file_mixes_kinds() -> None:
    docs = parse_all("""
apiVersion: persys.dev/v1
kind: Volume
metadata: {name: pg}
spec: {driver: ceph-rbd, sizeMb: 100}
---
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: db}
spec:
  type: process
  process: {command: [sleep, "60"]}
  volumes: [{name: data, claim: pg, mountPath: /data}]
""")
    assert [v.metadata.name for v in docs.volumes] == ["pg"]
    assert docs.workloads[0].spec.volumes[0].claim == "pg"


def test_a_claim_leaves_the_volume_settings_to_the_volume() -> None:
    wrong = VolumeSpec.model_validate({"name": "d", "claim": "pg", "mountPath": "/d", "sizeMb": 5})
    assert wrong.claim_problem() == "sizeMb: set on the Volume 'pg', not on the claim"
    plain = VolumeSpec.model_validate({"name": "d", "mountPath": "/d"})
    claimed = VolumeSpec.model_validate({"name": "d", "mountPath": "/d", "claim": "pg"})
    assert "claim" not in plain.to_doc()  # unset stays out of existing workloads' revisions
    assert claimed.single_writer()


def test_inline_volumes_stand_for_records() -> None:
    v = VolumeSpec.model_validate({"name": "data", "driver": "nfs", "sizeMb": 10, "mountPath": "/d"})
    spec = inline_spec(v)
    assert spec.access_mode == VolumeAccess.MULTI_NODE_WRITER and spec.reclaim_policy == ReclaimPolicy.DELETE
    kept = inline_spec(VolumeSpec.model_validate({"name": "d", "mountPath": "/d", "retain": True}))
    assert kept.reclaim_policy == ReclaimPolicy.RETAIN and kept.size_mb == 1
    assert inline_volume_id("web", "data") == "web-data"
    long = inline_volume_id("w" * 60, "Data_Dir")
    assert len(long) <= 63 and long != inline_volume_id("w" * 60, "data-dir")


@pytest.mark.parametrize(("type_", "body"), [
    ("compose", {"inline": "services: {web: {image: busybox}}"}),
    ("microvm", {"kernel": "/k", "memoryMb": 64}),
])
def test_types_without_persys_volumes_refuse_them(type_: str, body: dict[str, Any]) -> None:
    """Refused at apply, naming the field and what to use instead: never accepted and ignored."""
    doc = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "w"},
           "spec": {"type": type_, type_: body, "volumes": [{"name": "d", "driver": "local", "sizeMb": 8,
                                                              "mountPath": "/d"}]}}
    with pytest.raises(ManifestError, match=r"spec\.volumes: ") as refused:
        parse_manifests(yaml.safe_dump(doc))
    assert "vm workload" in str(refused.value)
    del doc["spec"]["volumes"]
    assert parse_manifests(yaml.safe_dump(doc))  # the same without volumes is fine
