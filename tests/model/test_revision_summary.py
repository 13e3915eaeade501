"""What `persysctl rollout history` says each revision changed (persys.model.revision.change_summary),
table-driven from tests/model/revision_cases/summary.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model import WorkloadSpec
from persys.model.revision import change_summary
from tests.cases import load

CASES = load(__file__, "revision_cases/summary.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_change_summary(case: dict[str, Any]) -> None:
    before = WorkloadSpec.model_validate(case["before"]) if case["before"] is not None else None
    assert change_summary(before, WorkloadSpec.model_validate(case["after"])) == case["expect"]
