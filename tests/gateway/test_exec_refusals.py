"""Which workload types take persysctl exec and cp, and the one line a refusal says: cases in
exec_cases/refusals.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.gateway.routes.exec_routes import refusal
from tests.cases import load

CASES = load(__file__, "exec_cases/refusals.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_refusal(case: dict[str, Any]) -> None:
    why = refusal("web", case["kind"], case["what"])
    if "refused" not in case:
        assert why == ""
    else:
        assert case["refused"] in why and "\n" not in why, why
