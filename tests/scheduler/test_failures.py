"""What a failure leaves on a workload, table-driven from tests/scheduler/failure_cases/cases.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model import WorkloadStatus
from persys.scheduler.mirror import quarantine
from persys.scheduler.rules import failures
from persys.scheduler.work.worker_watch import WorkerWatch
from tests.cases import load

CASES = load(__file__, "failure_cases/cases.yaml")


@pytest.mark.parametrize("case", CASES["status"], ids=[c["name"] for c in CASES["status"]])
def test_status_after_a_failure(case: dict[str, Any]) -> None:
    prev = WorkloadStatus.model_validate(case["prev"]) if "prev" in case else None
    if case["kind"] == "failure":
        got = failures.failure_status(prev, case["reason"], case["message"], 5.0)
    else:
        refused = quarantine.RefusedWorkload(id="w", problems=tuple(case["problems"]), doc=None)
        got = quarantine.refused_status(prev, refused, 5.0)
    if case["expect"] == "unchanged":
        assert got is None
        return
    assert got is not None
    assert got.to_doc() == {**WorkloadStatus.model_validate(case["expect"]).to_doc(), "updatedAt": 5.0}


@pytest.mark.parametrize("case", CASES["unplaced"], ids=[c["name"] for c in CASES["unplaced"]])
def test_unplaced(case: dict[str, Any]) -> None:
    assert failures.unplaced(case["instances"], case["placement"]) == case["expect"]


@pytest.mark.parametrize("case", CASES["worker"], ids=[c["name"] for c in CASES["worker"]])
def test_worker_health(case: dict[str, Any]) -> None:
    watch = WorkerWatch()
    for at, error in case["failures"]:
        watch.failed(error, at)
    assert watch.problem(case["running"], case["active"], case["now"]) == case["expect"]


@pytest.mark.parametrize("case", CASES["restart"], ids=[c["name"] for c in CASES["restart"]])
def test_worker_restart_backs_off(case: dict[str, Any]) -> None:
    watch = WorkerWatch()
    for at, error in case["failures"]:
        watch.failed(error, at)
    assert watch.restart_delay() == case["expect"]


def test_describe_is_one_bounded_line() -> None:
    text = failures.describe(ValueError("a\nb " + "x" * 2000))
    assert text.startswith("ValueError: a b x") and "\n" not in text and len(text) == failures.MESSAGE_LIMIT


def test_a_refused_document_marked_deleting_stays_refused_and_keeps_its_spec() -> None:
    r = quarantine.parse_stored("w", b'{"id": "w", "spec": {"type": "process", "replicas": 0}}')
    assert isinstance(r, quarantine.RefusedWorkload) and not r.deleting
    assert r.spec_json() == b'{"type": "process", "replicas": 0}'
    again = quarantine.parse_stored("w", quarantine.marked_deleting(r, 7.0))
    assert isinstance(again, quarantine.RefusedWorkload) and again.deleting
    junk = quarantine.parse_stored("w", b"[1, 2]")
    assert isinstance(junk, quarantine.RefusedWorkload) and junk.spec_json() is None
