"""The agent's choice of scheduler replica, table-driven from tests/agent/failover_cases/cases.yaml,
and the acknowledgement deadline."""

from __future__ import annotations

from typing import Any

import pytest

from persys.agent.failover import STANDBY, AckDeadline, Probe, abandons, better_target, next_target
from tests.cases import load

CASES = load(__file__, "failover_cases/cases.yaml")
PROBE_CASES = load(__file__, "failover_cases/probes.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_next_target(case: dict[str, Any]) -> None:
    targets = case.get("targets", ["a", "b", "c"])
    got = next_target(targets, case["current"], case["code"], case["pointer"], case.get("suspect", {}), 100.0)
    assert got == case["expect"]


@pytest.mark.parametrize(("code", "pointer", "expect"), [
    ("FAILED_PRECONDITION", "b", False),  # a standby that knows the active one is fine
    ("FAILED_PRECONDITION", "", True),
    ("FAILED_PRECONDITION", "a", False),  # names itself: elected and catching up, stay
    ("UNAVAILABLE", "", True),
    ("ACK_DEADLINE", "", True),
    ("NOT_FOUND", "", False),
])
def test_which_answers_make_a_replica_suspect(code: str, pointer: str, expect: bool) -> None:
    assert abandons(code, pointer, "a") is expect


def test_ack_deadline_runs_from_the_last_answer() -> None:
    d = AckDeadline(6.0)
    assert not d.expired(1e9) and d.due_in(0) == float("inf")  # no stream open
    d.opened(10.0)
    assert d.due_in(12.0) == 4.0 and not d.expired(15.9)
    d.acked(15.0)  # an acknowledgement moves the deadline
    assert not d.expired(20.9) and d.expired(21.0)
    d.closed()
    assert not d.expired(100.0)


def _probe(text: str) -> Probe:
    outcome, _, pointer = text.partition(":")
    return Probe(outcome, pointer) if outcome == STANDBY else Probe(outcome)


@pytest.mark.parametrize("case", PROBE_CASES, ids=[c["name"] for c in PROBE_CASES])
def test_better_target(case: dict[str, Any]) -> None:
    probes = {t: _probe(p) for t, p in case["probes"].items()}
    got = better_target(case.get("targets", ["a", "b", "c"]), case.get("current", "a"), probes,
                        case.get("suspect", {}), 100.0)
    assert got == case["expect"]
