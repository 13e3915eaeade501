"""Unknown manifest fields name the closest known field of their model: table-driven from
tests/model/manifest_cases/unknown_fields.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model import ManifestError
from persys.model.kinds import validate_volume
from persys.model.manifest import validate_manifest
from tests.cases import load

CASES = load(__file__, "manifest_cases/unknown_fields.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_unknown_field(case: dict[str, Any]) -> None:
    with pytest.raises(ManifestError) as exc:
        validate_manifest({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "w"},
                           "spec": case["spec"]})
    assert case["problem"] in exc.value.problems, exc.value.problems


def test_other_kinds_suggest_too() -> None:
    with pytest.raises(ManifestError) as exc:
        validate_volume({"apiVersion": "persys.dev/v1", "kind": "Volume", "metadata": {"name": "v"},
                         "spec": {"driver": "local", "sizeMB": 8}})
    assert "spec.sizeMB: unknown field (did you mean 'sizeMb'?)" in exc.value.problems, exc.value.problems
