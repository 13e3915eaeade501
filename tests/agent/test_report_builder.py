"""What the agent reports (persys.agent.decide.report), table-driven from tests/agent/report_cases/.
Pure: the messages are built from plain state, no scheduler and no clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.decide import report
from persys.agent.runtimes.base import ObservedWorkload, RuntimeState
from persys.model.status import WorkloadUsage
from tests.agent.test_plan import desired, failure, observed
from tests.cases import load

CASES = Path(__file__).parent / "report_cases"
BUILD = load(CASES, "build.yaml")
SELECT = load(CASES, "select.yaml")


def usage(wid: str, u: dict[str, Any]) -> ObservedWorkload:
    return ObservedWorkload(wid, "r1", 1, RuntimeState.RUNNING, "rt-" + wid,
                            usage=WorkloadUsage(cpu_percent=u.get("cpu", 0.0), memory_bytes=u.get("memory", 0)))


@pytest.mark.parametrize("case", BUILD, ids=[c["name"] for c in BUILD])
def test_build(case: dict[str, Any]) -> None:
    reports = report.build(report.Local(
        now=case["now"],
        desired={w: desired(d or {}) for w, d in case.get("desired", {}).items()},
        observed={w: observed(w, o)[1] for w, o in case.get("observed", {}).items()},
        failures={w: failure(f) for w, f in case.get("failures", {}).items()},
        restarts=case.get("restarts", {}), usage={w: usage(w, u) for w, u in case.get("usage", {}).items()},
        fenced=case.get("fenced", {}), failure_grace=case.get("failure_grace", 30.0),
        last_exits=case.get("last_exits", {})))
    got = {r.instance_id: r for r in reports}
    assert set(got) == set(case["expect"])
    for wid, fields in case["expect"].items():
        for key, want in fields.items():
            value = getattr(got[wid], key)
            if key == "state":
                value = pb.WorkloadState.Name(value)
            assert value == want, f"{wid}.{key}"


def _reports(states: dict[str, str]) -> list[pb.WorkloadReport]:
    return [pb.WorkloadReport(instance_id=w, revision="r1", state=pb.WorkloadState.Value(f"WORKLOAD_STATE_{s}"))
            for w, s in states.items()]


@pytest.mark.parametrize("case", SELECT, ids=[c["name"] for c in SELECT])
def test_select(case: dict[str, Any]) -> None:
    last = None
    if "last" in case:
        last = {r.instance_id: report.fingerprint(r) for r in _reports(case["last"])}
    out = report.select(_reports(case["reports"]), last, case["now"], case.get("last_full", 0.0))
    want = case["expect"]
    if want["sent"] is None:
        assert out is None
        return
    assert out is not None
    assert [r.instance_id for r in out.reports] == want["sent"]
    assert out.complete == want["complete"]
    assert set(out.seen) == set(case["reports"])
