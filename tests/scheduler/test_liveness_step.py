"""One liveness step of a replica (`liveness.check`: what it saw of each agent -> transitions),
table-driven from tests/scheduler/liveness_step_cases/*.yaml. Unlike liveness_cases (the judge
given heartbeats), these start from the replica's in-memory facts: when each agent last spoke
(`heard_at`) and where its grace period runs from (`last_heartbeat`, moved forward by a
handoff or a stall of our own). Pure: clock values are data, no sleeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.model import NodeStatus
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.decide.liveness import GuardState, Heard, check
from tests.cases import load

CASE_DIR = Path(__file__).parent / "liveness_step_cases"
CASES = [c for f in sorted(CASE_DIR.glob("*.yaml")) for c in load(f)]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_liveness_step(case: dict[str, Any]) -> None:
    config = SchedulerConfig(node_grace_seconds=float(case.get("grace", 10)), **case.get("config", {}))
    nodes = {n: NodeStatus(s) for n, s in case["nodes"].items()}
    guard = GuardState()
    for i, step in enumerate(case["steps"]):
        seen = {n: Heard(float(h[0]), float(h[1])) for n, h in (step.get("seen") or {}).items()}
        verdict = check(nodes, seen, float(step["now"]), float(case.get("since", 1000)), config.node_grace_seconds,
                        guard, config.liveness_guard())
        guard = verdict.guard
        got = {t.node_id: ("Ready" if t.ready else "NotReady") for t in verdict.transitions}
        assert got == (step.get("expect") or {}), f"step {i + 1}"
        for t in verdict.transitions:
            nodes[t.node_id] = NodeStatus.READY if t.ready else NodeStatus.NOT_READY
