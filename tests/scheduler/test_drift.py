"""Drift detection, table-driven from tests/scheduler/drift_cases/cases.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model import Assignment, DesiredState, Phase, RestartPolicy
from persys.scheduler.decide.drift import Reported, detect
from tests.cases import load

CASES = load(__file__, "drift_cases/cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_drift_case(case: dict[str, Any]) -> None:
    assigned = {
        inst: Assignment(instance_id=inst, node_id="n1", revision=a["revision"], generation=1,
                         desired_state=DesiredState(a.get("desired_state", "Running")),
                         created_at=a.get("created_at", 0.0))
        for inst, a in case["assigned"].items()
    }
    reports = [Reported(r["instance"], r["revision"], Phase(r["phase"]), r.get("terminal", False))
               for r in case["reports"]]
    known = set(case.get("known", [*case["assigned"], *[r["instance"] for r in case["reports"]]]))
    policies = case.get("policy", {})
    elsewhere = case.get("elsewhere", {})
    found = detect(
        "n1", assigned, reports, case.get("complete", True),
        placement_of=lambda i: elsewhere.get(i, "n1" if i in assigned else None),
        restart_policy=lambda i: RestartPolicy(policies.get(i, "Always")) if i in known else None,
        now=1000.0,
    )
    assert len(found) == len(case["expect"]), found
    for drift, want in zip(found, case["expect"], strict=True):
        assert (drift.kind, drift.instance) == (want["kind"], want["instance"])
        assert want.get("rule", "") in drift.rule
        assert want.get("action", "") in drift.action
