"""The state mirror's health rules, table-driven from tests/scheduler/mirror_health_cases/cases.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.scheduler.mirror.health import LagTracker, MirrorSnapshot, judge
from tests.cases import load

CASES = load(__file__, "mirror_health_cases/cases.yaml")


@pytest.mark.parametrize("case", CASES["judge"], ids=[c["name"] for c in CASES["judge"]])
def test_judge(case: dict[str, Any]) -> None:
    got = judge(MirrorSnapshot(**case["snapshot"]), stall_after=10.0)
    want = case["expect"]
    assert (got.watch, got.lag) == (want["watch"], want["lag"])
    if "detail" in want:
        assert want["detail"] in got.detail
    assert (got.detail == "") == (got.watch == "healthy")


@pytest.mark.parametrize("case", CASES["tracker"], ids=[c["name"] for c in CASES["tracker"]])
def test_lag_tracker(case: dict[str, Any]) -> None:
    t = LagTracker()
    for store_rev, mirror_rev, now in case["probes"]:
        t.observe(store_rev, mirror_rev, now)
    ask, want = case["ask"], case["expect"]
    assert t.behind_for(ask["mirror"], ask["at"]) == pytest.approx(want["behind_for"])
    assert t.store_revision == want["store_revision"]
