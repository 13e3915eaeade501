"""The model refuses what the placement engine cannot evaluate, naming the field: table-driven
from tests/model/manifest_cases/placement_fields.yaml."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from persys.model import ManifestError
from persys.model.manifest import validate_manifest
from tests.cases import load

CASES = load(__file__, "manifest_cases/placement_fields.yaml")
BASE: dict[str, Any] = {
    "apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "w"},
    "spec": {"type": "process", "process": {"command": ["sleep", "60"]}},
}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_placement_field(case: dict[str, Any]) -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(case["spec"])
    if "refused" not in case:
        m = validate_manifest(doc)
        assert m.spec.to_doc()  # accepted and serialisable
        return
    with pytest.raises(ManifestError) as exc:
        validate_manifest(doc)
    assert any(p.startswith(case["refused"]) for p in exc.value.problems), exc.value.problems
