"""Rightsizing warns when an automation policy acts on the same workload's same metric: table
cases (rightsize_cases/automation.yaml) over the pure functions, then the answer's form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.intelligence.automation_overlap import annotate, overlaps
from persys.intelligence.rightsize import recommend

CASES = yaml.safe_load((Path(__file__).parent / "rightsize_cases" / "automation.yaml").read_text())
NOW = 1_800_000_000.0


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_overlap_cases(case: dict[str, Any]) -> None:
    found = overlaps(case["policies"], case["workload"])
    rec = recommend(case["workload"], [(NOW - 60 * i, 40.0) for i in range(30)],
                    [(NOW - 60 * i, 64e6) for i in range(30)], NOW, 500, 128, evidence=("workload/web@r1",))
    out = annotate(rec.to_dict(), found)
    for res in ("cpu", "memory"):
        named = sorted(o.policy for o in found if o.metric == res)
        assert named == sorted(case[res]), (res, found)
        assert len(out[res]["warnings"]) == len(case[res])
        for p in case[res]:
            assert any(p in w for w in out[res]["warnings"])
    assert [w["policy"] for w in out["warnings"]] == [o.policy for o in found]
    # Every warning cites the policy at its version; the recommendation itself is unchanged.
    assert out["evidence"] == ["workload/web@r1", *(f"policy/{o.policy}@v{o.version}" for o in found)]
    assert out["cpu"]["target"] == rec.to_dict()["cpu"]["target"]
    for word in case.get("words", []):
        assert any(word in w["message"] for w in out["warnings"]), word
