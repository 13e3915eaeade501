"""Refused joins recorded per window (scheduler.refusal_budget, pure), from refusal_budget_cases/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.scheduler.refusal_budget import RefusalBudget

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "refusal_budget_cases" / "cases.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_budget(case: dict[str, Any]) -> None:
    budget = RefusalBudget(case["per_window"], case["window"])
    assert [list(budget.admit(t)) for t in case["at"]] == case["expect"]
