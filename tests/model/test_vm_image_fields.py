"""A VM image from a URL needs its checksum, and the model says so naming the field: table-driven
from tests/model/manifest_cases/vm_image.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model import ManifestError
from persys.model.manifest import validate_manifest
from tests.cases import load

CASES = load(__file__, "manifest_cases/vm_image.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_vm_image_field(case: dict[str, Any]) -> None:
    doc = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "w"},
           "spec": {"type": "vm", "vm": case["vm"]}}
    if "refused" not in case:
        assert validate_manifest(doc).spec.to_doc()["vm"]["image"] == case["vm"]["image"]
        return
    with pytest.raises(ManifestError) as exc:
        validate_manifest(doc)
    assert any(p.startswith(case["refused"]) for p in exc.value.problems), exc.value.problems


def test_a_spec_without_a_url_keeps_its_revision() -> None:
    """imageSha256 unset stays out of the revision hash: VMs running before it existed are not replaced."""
    doc = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "w"},
           "spec": {"type": "vm", "vm": {"image": "debian-12", "memoryMb": 128}}}
    spec = validate_manifest(doc).spec
    assert "imageSha256" not in spec.to_doc()["vm"]
    assert spec.spec_revision() == "4cc2b6573ecd"  # this spec's revision before the field existed
