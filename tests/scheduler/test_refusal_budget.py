"""Refused joins recorded per window (scheduler.refusal_budget, pure), from refusal_budget_cases/."""

from __future__ import annotations

from typing import Any

import pytest

from persys.scheduler.access.refusal_budget import RefusalBudget
from tests.cases import load

CASES: list[dict[str, Any]] = load(__file__, "refusal_budget_cases/cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_budget(case: dict[str, Any]) -> None:
    budget = RefusalBudget(case["per_window"], case["window"])
    assert [list(budget.admit(t)) for t in case["at"]] == case["expect"]
