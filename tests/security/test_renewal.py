"""When certificates are renewed (persys.security.renewal), table-driven from renewal_cases/."""

from __future__ import annotations

from typing import Any

import pytest

from persys.security.renewal import Validity, expired, renew_at, retry_at
from tests.cases import load

CASES: list[dict[str, Any]] = load(__file__, "renewal_cases/schedule.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_schedule(case: dict[str, Any]) -> None:
    cert = Validity(**case["cert"])
    expect = case["expect"]
    if "renew" in expect:
        assert renew_at(cert, case.get("jitter", 1.0)) == pytest.approx(expect["renew"])
    if "retry" in expect:
        assert retry_at(cert, case["now"], case["failures"]) == pytest.approx(expect["retry"])
    if "expired" in expect:
        assert expired(cert, case["now"]) is expect["expired"]
