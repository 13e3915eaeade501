"""The desired-state delta protocol (`delivery.DeltaSender.step`), table-driven from
tests/scheduler/delivery_cases/*.yaml: each step is a node's assignments (instance ->
revision/state), the mode and whether a resync was asked; it expects the message sent (full or
not, the instances listed, the ones removed) or none. Pure: no stream, no sleeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.model import Assignment
from persys.scheduler.work.delivery import DeltaSender
from tests.cases import load

CASE_DIR = Path(__file__).parent / "delivery_cases"
CASES = [c for f in sorted(CASE_DIR.glob("*.yaml")) for c in load(f)]


def assignment(inst: str, doc: str) -> Assignment:
    revision, _, state = doc.partition("/")
    return Assignment(instance_id=inst, node_id="n1", revision=revision, generation=1,
                      desired_state=state or "Running", created_at=0.0)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_delivery_case(case: dict[str, Any]) -> None:
    sender = DeltaSender(deltas=case.get("deltas", True))
    gone = set(case.get("workloads_gone", []))
    for i, step in enumerate(case["steps"]):
        asked: list[bool] = []

        def resync(step: dict[str, Any] = step, asked: list[bool] = asked) -> bool:
            asked.append(True)
            return bool(step.get("resync", False))

        msg = sender.step([assignment(k, v) for k, v in (step.get("assigned") or {}).items()],
                          step.get("mode", "normal"), resync,
                          lambda wid: None if wid in gone else f"spec of {wid}".encode())
        want = step["expect"]
        got = None if msg is None else {"full": msg.full, "items": [it.workload_id for it in msg.items],
                                        "removed": msg.removed}
        assert got == want, f"step {i + 1}"
        if "resync_asked" in step:
            assert bool(asked) == step["resync_asked"], f"step {i + 1}: resync asked"
