"""The agent's local decision (persys.agent.decide.plan), table-driven from tests/agent/plan_cases/:
restart policy, backoff, orphan grace, disconnection stops. Pure: no runtime, no clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.agent.decide import plan
from persys.agent.runtimes.base import ObservedWorkload, RuntimeState
from persys.model import DesiredState, WorkloadSpec
from tests.cases import load as load_cases

CASES = Path(__file__).parent / "plan_cases"


def load(name: str) -> list[dict[str, Any]]:
    return load_cases(CASES, name)  # type: ignore[no-any-return]


PLAN = load("restart.yaml") + load("orphans.yaml") + load("disconnect.yaml") + load("pull.yaml")
OUTCOMES = load("backoff.yaml") + load("pull_outcomes.yaml")


def desired(d: dict[str, Any]) -> plan.Desired:
    kind = d.get("type", "process")
    spec: dict[str, Any] = {"type": kind, "process": {"command": ["sleep", "1"]}} if kind == "process" \
        else {"type": kind, kind: {"image": "busybox"}}
    for key in ("restartPolicy", "onDisconnect"):
        if key in d:
            spec[key] = d[key]
    return plan.Desired(d.get("revision", "r1"), d.get("generation", 1), DesiredState(d.get("state", "Running")),
                        WorkloadSpec.model_validate(spec))


def observed(wid: str, o: dict[str, Any]) -> tuple[str, ObservedWorkload]:
    return o.get("runtime", "process"), ObservedWorkload(
        wid, o.get("revision", "r1"), o.get("generation", 1), RuntimeState(o["state"]), "rt-" + wid,
        exit_code=o.get("exit_code"))


def failure(f: dict[str, Any]) -> plan.Failure:
    return plan.Failure(f.get("revision", "r1"), f.get("code", "StartFailed"), f.get("message", ""),
                        f.get("terminal", False), f.get("attempts", 1), f.get("next_try", 0.0), f.get("since", 0.0),
                        pending=f.get("pending", False), credentials=f.get("credentials"))


def snapshot(case: dict[str, Any]) -> plan.Snapshot:
    c = case.get("contact", {})
    return plan.Snapshot(
        now=case["now"],
        desired={w: desired(d or {}) for w, d in case.get("desired", {}).items()},
        observed={w: observed(w, o) for w, o in case.get("observed", {}).items()},
        runtimes=frozenset(case.get("runtimes", ["process"])),
        contact=plan.Contact(started_at=c.get("started_at", 0.0), last_ack=c.get("last_ack"),
                             last_full_set=c.get("last_full_set"), grace=c.get("grace", 0.0),
                             heartbeat_interval=c.get("heartbeat", 3.0)),
        failures={w: failure(f) for w, f in case.get("failures", {}).items()},
        fenced=case.get("fenced", {}), resume=frozenset(case.get("resume", [])),
        synced=case.get("synced", True), mode=case.get("mode", "normal"),
        known=frozenset(case.get("known", [])), unreadable=frozenset(case.get("unreadable", [])),
        orphans=case.get("orphans", {}), orphan_grace=case.get("orphan_grace", 30.0),
        credentials=case.get("credentials"))


def spelled(a: plan.Action) -> str:
    if a.kind == "start":
        return f"{'restart' if a.restart else 'start'} {a.workload_id}"
    if a.kind == "remove" and a.orphan_for is not None:
        return f"remove orphan {a.workload_id} after {a.orphan_for:g}s"
    return f"{a.kind} {a.workload_id}"


@pytest.mark.parametrize("case", PLAN, ids=[c["name"] for c in PLAN])
def test_plan(case: dict[str, Any]) -> None:
    s = snapshot(case)
    p = plan.plan(s)
    want = case["expect"]
    assert [spelled(a) for a in p.actions] == want.get("actions", [])
    if "failures" in want:  # workload -> failure code, after the decision (before any outcome)
        assert {w: f.code for w, f in p.failures.items()} == want["failures"]
    if "orphans" in want:
        assert p.orphans == want["orphans"]
    if "fenced" in want:
        assert p.fenced == want["fenced"]
    if "resume" in want:
        assert sorted(p.resume) == want["resume"]
    if "kept" in want:
        assert list(p.kept) == want["kept"]
    # The step decides only: what it was given is left as it was.
    assert s == snapshot(case)


@pytest.mark.parametrize("case", OUTCOMES, ids=[c["name"] for c in OUTCOMES])
def test_outcome(case: dict[str, Any]) -> None:
    prev = failure(case["prev"]) if case.get("prev") else None
    jitter = case.get("jitter", 1.0)
    if case["outcome"] == "restarted":
        f = plan.after_restart(prev, case.get("revision", "r1"), case["now"], jitter)
    elif case["outcome"] == "pending":
        f = plan.while_pending(prev, case.get("revision", "r1"), case["code"], case.get("message", ""), case["now"])
    else:
        err = case["error"]
        f = plan.after_failure(prev, case.get("revision", "r1"), err["code"], err.get("message", ""),
                               err.get("terminal", False), case["now"], jitter, err.get("credentials"))
    got = {"code": f.code, "attempts": f.attempts, "next_try": f.next_try, "since": f.since, "terminal": f.terminal,
           "pending": f.pending, "credentials": f.credentials}
    for key, value in case["expect"].items():
        assert got[key] == (pytest.approx(value) if isinstance(value, float) else value), key
