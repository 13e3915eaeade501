"""Node liveness and the mass-loss guard, table-driven from tests/scheduler/liveness_cases/*.yaml.

Each case is a sequence of steps over one replica: a step judges the nodes at a clock value with
the heartbeats seen so far (or is an operator ending the suspension); the transitions it returns
are applied to the stored statuses before the next step, as the scheduler's writes would be.
Node ids may be written as ranges, `m0..9` standing for m0 ... m9."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from persys.model import NodeStatus
from persys.scheduler.decide.liveness import GuardConfig, GuardState, end_suspension, judge
from tests.cases import load

CASE_DIR = Path(__file__).parent / "liveness_cases"
CASES = [c for f in sorted(CASE_DIR.glob("*.yaml")) for c in load(f)]
RANGE = re.compile(r"^(.*?)(\d+)\.\.(\d+)$")


def expand(doc: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (doc or {}).items():
        m = RANGE.match(str(key))
        if m:
            for i in range(int(m[2]), int(m[3]) + 1):
                out[f"{m[1]}{i}"] = value
        else:
            out[str(key)] = value
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_liveness_case(case: dict[str, Any]) -> None:
    config = GuardConfig(**case.get("config", {}))
    grace, since = float(case.get("grace", 10)), float(case.get("since", 1000))
    nodes = {n: NodeStatus(s) for n, s in expand(case["nodes"]).items()}
    heard: dict[str, float] = {}
    guard = GuardState()
    for i, step in enumerate(case["steps"]):
        where = f"step {i + 1}"
        want = step.get("expect", {})
        if step.get("operator_end"):
            guard, event = end_suspension(guard, "admin")
            events = [event] if event else []
            transitions = {}
        else:
            heard.update({n: float(t) for n, t in expand(step.get("heard")).items()})
            for gone in step.get("deleted", []):
                nodes.pop(gone, None)
            verdict = judge(nodes, heard, float(step["now"]), since, grace, guard, config,
                            {n: float(t) for n, t in expand(step.get("grace_from")).items()},
                            float(case.get("restart_grace", 0)))
            guard, events = verdict.guard, verdict.events
            transitions = {t.node_id: ("Ready" if t.ready else "NotReady") for t in verdict.transitions}
            for t in verdict.transitions:
                nodes[t.node_id] = NodeStatus.READY if t.ready else NodeStatus.NOT_READY
            for node_id, text in want.get("reason", {}).items():
                got = next(t.reason for t in verdict.transitions if t.node_id == node_id)
                assert text in got, f"{where}: {node_id}: {got!r}"
        assert transitions == expand(want.get("transitions")), where
        assert [(e.kind, e.reason) for e in events] == [tuple(e) for e in want.get("events", [])], where
        for text in want.get("event_text", []):
            assert any(text in e.message for e in events), f"{where}: {text!r} not in {events}"
        if "suspended" in want:
            assert guard.suspended == want["suspended"], where
        if "silent" in want:
            assert guard.silent == want["silent"], where
        if "ends_at" in want:
            assert guard.ends_at == want["ends_at"], where
