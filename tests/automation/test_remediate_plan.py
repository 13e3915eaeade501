"""Pure: the remediate plan (remediate_cases.yaml): cordon after repeated failures, once; restart
failed workloads once per window; everything under the hourly rate limit."""

from __future__ import annotations

from typing import Any

import pytest

from persys.automation.remediate import Done, FailedInstance, Failure, NodeView, plan
from persys.model.automation import Remediate
from tests.cases import load

CASES: list[dict[str, Any]] = load(__file__, "remediate_cases.yaml")
NOW = 1_000_000.0


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_plan(case: dict[str, Any]) -> None:
    got = plan(Remediate.model_validate(case["spec"]), NOW,
               [Failure(NOW - ago, node, "w", f"e{i}") for i, (ago, node) in enumerate(case.get("failures", []))],
               [NodeView(n, c) for n, c in case.get("nodes", [])],
               [FailedInstance(w, i, n, "Exited") for w, i, n in case.get("failed", [])],
               [Done(NOW - ago, t, target) for ago, t, target in case.get("done", [])])
    assert [[p.type, p.target, p.held_by] for p in got] == case["expect"]
    assert all(p.reason for p in got)
