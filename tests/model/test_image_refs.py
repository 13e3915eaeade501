"""Container image references are checked at apply as Docker reads them, naming the field:
table-driven from tests/model/manifest_cases/image_refs.yaml (an unpullable reference used to
be stored and retried forever with a generic error)."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model import ManifestError
from persys.model.manifest import validate_manifest
from tests.cases import load

CASES = load(__file__, "manifest_cases/image_refs.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_image_reference(case: dict[str, Any]) -> None:
    doc = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "w"},
           "spec": {"type": "container", "container": {"image": case["image"]}}}
    if "refused" not in case:
        assert validate_manifest(doc).spec.container.image == case["image"]  # type: ignore[union-attr]
        return
    with pytest.raises(ManifestError) as exc:
        validate_manifest(doc)
    assert any(p.startswith(case["refused"]) for p in exc.value.problems), exc.value.problems
