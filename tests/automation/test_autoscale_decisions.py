"""Pure: the autoscale decision (autoscale_cases.yaml: one evaluation per case) and runs of it
over a load (flap_cases.yaml: the anti-flap guarantees, through replay.simulate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.automation.autoscale import Action, History, Observation, Recommendation, decide
from persys.automation.replay import Step, report, simulate
from persys.model.automation import Autoscale
from tests.cases import load

HERE = Path(__file__).parent
CASES: list[dict[str, Any]] = load(__file__, "autoscale_cases.yaml")
RUNS: list[dict[str, Any]] = load(__file__, "flap_cases.yaml")
NOW = 1_000_000.0


def spec_of(doc: dict[str, Any]) -> Autoscale:
    return Autoscale.model_validate({"workload": "web", **doc})


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_decision(case: dict[str, Any]) -> None:
    spec = spec_of(case["spec"])
    o = case["obs"]
    reporting = o.get("reporting", o["current"])
    missing = o.get("missing", False)
    obs = Observation(NOW, o["current"], None if missing else o["perReplica"] * reporting,
                      None if missing else NOW - o.get("age", 5), 0 if missing else reporting, o.get("activation"))
    h = case.get("history", {})
    hist = History(tuple(Recommendation(NOW - ago, r) for ago, r in h.get("recommendations", [])),
                   tuple(Action(NOW - ago, a, b) for ago, a, b in h.get("actions", [])))
    v = decide(spec, obs, hist)
    want = case["expect"]
    assert (v.raw_desired, v.desired, v.held_by) == (want["raw"], want["desired"], want["heldBy"]), v.reason
    assert v.reason  # every decision says why


def load_at(load: dict[str, Any], t: float) -> float:
    if "square" in load:
        low, high = load["square"]
        return float(high if int(t // (load["periodSeconds"] / 2)) % 2 == 0 else low)
    value = 0.0
    for start, v in load["steps"]:
        if t >= start:
            value = float(v)
    return value


@pytest.mark.parametrize("case", RUNS, ids=[c["name"] for c in RUNS])
def test_run(case: dict[str, Any]) -> None:
    spec = spec_of(case["spec"])
    run = case["run"]
    steps = [Step(NOW + t, load_at(run["load"], t), NOW + t - 5)
             for t in range(0, run["seconds"], run["interval"])]
    replay = simulate(spec, steps, run["start"])
    acts = replay.actions()
    rep = report(spec, replay, run["interval"])
    want = case["expect"]
    if "maxActionsPerWindow" in want:
        w = want["maxActionsPerWindow"]
        worst = max((sum(1 for a in acts if t <= a[0] < t + w["seconds"]) for t, _, _ in acts), default=0)
        assert worst <= w["actions"], acts
    assert len(acts) <= want.get("maxActions", len(acts)), acts
    assert len(acts) >= want.get("minActions", 0), acts
    if "flaps" in want:
        assert rep["flaps"] == want["flaps"], acts
    assert rep["flaps"] >= want.get("minFlaps", 0), acts
    if "finalReplicas" in want:
        assert replay.decisions[-1].verdict.desired == want["finalReplicas"], acts
    assert rep["actions"] == len(acts)
