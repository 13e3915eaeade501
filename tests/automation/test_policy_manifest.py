"""Pure: `kind: Policy` validation (manifest_cases.yaml): every refusal names its field."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model.automation import validate_policy
from persys.model.kinds import parse_all
from persys.model.manifest import ManifestError
from tests.cases import load

CASES: list[dict[str, Any]] = load(__file__, "manifest_cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_manifest(case: dict[str, Any]) -> None:
    doc = {"apiVersion": "persys.dev/v1", "kind": "Policy", **case["doc"]}
    if case.get("ok"):
        assert validate_policy(doc).metadata.name == doc["metadata"]["name"]
        return
    with pytest.raises(ManifestError) as err:
        validate_policy(doc)
    hits = [p for p in err.value.problems if p.startswith(case["error"] + ":")]
    assert hits, err.value.problems
    assert case["says"] in hits[0]


def test_apply_files_carry_policies() -> None:
    docs = parse_all("apiVersion: persys.dev/v1\nkind: Policy\nmetadata: {name: p}\nspec: {remediate: {}}\n"
                     "---\napiVersion: persys.dev/v1\nkind: Workload\nmetadata: {name: w}\n"
                     "spec: {type: process, process: {command: [sleep, '1']}}\n")
    assert [p.metadata.name for p in docs.policies] == ["p"]
    assert [w.metadata.name for w in docs.workloads] == ["w"]
