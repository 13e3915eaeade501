"""Replay agrees with the live policy on the same data: the live loop (persys.automation.loop,
with its decision log, history reload and actions) runs over a meter history as it is recorded,
then `replay` runs the policy's pure function over that recorded history: the same actions at
the same times.

The API here is a stand-in (`RecordedCluster`): the meter answers from the history this test
records and the workload's replica count is what the loop last applied. The point of the test is
identical inputs to both paths; the whole stack with a real meter is test_autoscale_e2e.py.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from persys.automation.loop import AutomationLoop
from persys.automation.observe import Series
from persys.automation.replay import report, simulate, steps_from_series
from persys.client import SchedulerError
from persys.model.automation import Policy, PolicyManifest

STEP = 10
T0 = 1_800_000_000.0


class RecordedCluster:
    """A workload whose total load is `load(t)`, shared by its replicas; the meter keeps each
    instance's value per 10 s bucket while it exists."""

    def __init__(self, policy: Policy, load: Any, replicas: int) -> None:
        self.policy, self.load, self.replicas = policy, load, replicas
        self.points: dict[str, list[tuple[float, float]]] = {}
        self.decisions: list[dict[str, Any]] = []
        self.now = T0

    def record_bucket(self, t: float) -> None:
        for i in range(self.replicas):
            inst = "web" if i == 0 else f"web.{i}"
            self.points.setdefault(inst, []).append((t, self.load(t) / self.replicas))

    async def list_automation_policies(self) -> dict[str, Any]:
        return {"items": [self.policy.view()], "pause": {"paused": False}}

    async def list_decisions(self, policy: str = "", since: float = 0.0, limit: int = 0, outcome: str = ""
                             ) -> list[dict[str, Any]]:
        return [d for d in self.decisions if d["ts"] >= since][-limit:]

    async def record_decisions(self, decisions: list[dict[str, Any]]) -> list[str]:
        self.decisions += decisions
        return [str(len(self.decisions) - len(decisions) + i) for i in range(len(decisions))]

    async def get_workload(self, workload_id: str) -> dict[str, Any]:
        if workload_id != "web":
            raise SchedulerError("NOT_FOUND", workload_id)
        return {"name": "web", "labels": {}, "replicas": self.replicas, "revision": "r1",
                "instances": [{"instance": "web" if i == 0 else f"web.{i}"} for i in range(self.replicas)],
                "spec": {"type": "process", "process": {"command": ["sleep", "1"]}, "replicas": self.replicas}}

    async def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        self.replicas = manifest["spec"]["replicas"]
        return {"created": False, "changed": True}

    async def meter_query(self, selector: str, value: str, metric: str, since: float, step: int, agg: str
                          ) -> dict[str, Any]:
        assert (selector, value, metric, step, agg) == ("workload", "web", "cpu", STEP, "avg")
        lo = self.now - since
        return {"start": lo, "end": self.now, "series": [
            {"key": k, "points": [[t, v] for t, v in pts if lo < t <= self.now]} for k, pts in self.points.items()]}


def load_curve(t: float) -> float:
    """Quiet, a rise with noise, a plateau, a fall with a bump: percent of one core, in total."""
    x = t - T0
    base = 20 if x < 300 else 260 if x < 900 else 60 if x < 1500 else 20
    return base + 15 * math.sin(x / 37.0) + (40 if 1100 <= x < 1130 else 0)


@pytest.mark.parametrize("window", [0, 120])
def test_replay_takes_the_live_loops_actions(window: int) -> None:
    m = PolicyManifest.model_validate({
        "apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "web-cpu"},
        "spec": {"autoscale": {"workload": "web", "target": 50, "maxReplicas": 10, "intervalSeconds": STEP,
                               "metricWindowSeconds": 30, "stabilization": {"downSeconds": window},
                               "cooldown": {"upSeconds": 30}, "rate": {"down": {"replicas": 2}}}}})
    policy = Policy(name="web-cpu", spec=m.spec, created_at=T0, updated_at=T0)
    cluster = RecordedCluster(policy, load_curve, replicas=1)
    loops = [AutomationLoop(cluster, clock=lambda: cluster.now)]

    async def live() -> None:
        for k in range(200):  # 2,000 s, a decision each 10 s, just after each bucket is recorded
            if k in (95, 121):  # the automation restarts: its windows and cooldowns come back from the log
                loops.append(AutomationLoop(cluster, clock=lambda: cluster.now))
            loop = loops[-1]
            cluster.now = T0 + k * STEP
            cluster.record_bucket(cluster.now)
            await loop.run_once()

    asyncio.run(live())
    acted = [(d["ts"], d["action"]["from"], d["action"]["to"]) for d in cluster.decisions if d["outcome"] == "acted"]
    assert len(acted) >= 3, acted  # it did scale out and back in

    series = [Series(k, tuple(pts)) for k, pts in cluster.points.items()]
    assert m.spec.autoscale is not None
    steps = steps_from_series(m.spec.autoscale, series, T0, T0 + 199 * STEP, STEP, STEP)
    replayed = simulate(m.spec.autoscale, steps, 1)
    assert replayed.actions() == acted
    # Decision by decision: the same raw value, count and limit.
    live_rows = [(d["rawDesired"], d["desired"], d["heldBy"]) for d in cluster.decisions]
    assert [(s.verdict.raw_desired, s.verdict.desired, s.verdict.held_by) for s in replayed.decisions] == live_rows
    rep = report(m.spec.autoscale, replayed, STEP)
    assert rep["actions"] == len(acted) and rep["secondsOverTarget"] > 0


class ZeroCluster(RecordedCluster):
    """The same, with scale to zero: at zero the workload is stopped (no instance, no samples);
    `front`, the workload in front of it, keeps reporting its own load (the activation figure)."""

    def __init__(self, policy: Policy, load: Any, front: Any) -> None:
        super().__init__(policy, load, replicas=1)
        self.front = front
        self.stopped = False
        self.front_points: list[tuple[float, float]] = []

    def record_bucket(self, t: float) -> None:
        self.front_points.append((t, self.front(t)))
        if not self.stopped:
            super().record_bucket(t)

    async def get_workload(self, workload_id: str) -> dict[str, Any]:
        w = await super().get_workload(workload_id)
        if self.stopped:
            w.update(desiredState="Stopped", instances=[])
        return {**w, "desiredState": "Stopped" if self.stopped else "Running"}

    async def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        self.stopped = manifest["spec"].get("desiredState") == "Stopped"
        return await super().apply(manifest, dry_run)

    async def meter_query(self, selector: str, value: str, metric: str, since: float, step: int, agg: str
                          ) -> dict[str, Any]:
        if value == "web":
            return await super().meter_query(selector, value, metric, since, step, agg)
        assert (selector, value, metric, step, agg) == ("workload", "front", "cpu", STEP, "avg")
        lo = self.now - since
        return {"start": lo, "end": self.now,
                "series": [{"key": "front", "points": [[t, v] for t, v in self.front_points if lo < t <= self.now]}]}


def front_load(t: float) -> float:
    """Requests arrive (front busy), stop for ten minutes (web goes to zero), arrive again."""
    x = t - T0
    return 30 + 5 * math.sin(x / 23.0) if x < 400 or x >= 1000 else 1.0


def test_replay_of_scale_to_zero_takes_the_live_loops_actions() -> None:
    m = PolicyManifest.model_validate({
        "apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "web-cpu"},
        "spec": {"autoscale": {"workload": "web", "target": 50, "maxReplicas": 10, "intervalSeconds": STEP,
                               "metricWindowSeconds": 30, "cooldown": {"upSeconds": 30}, "minReplicas": 0,
                               "scaleToZero": {"activationThreshold": 5, "idleSeconds": 120,
                                               "activationWorkload": "front", "activationMetric": "cpu"}}}})
    policy = Policy(name="web-cpu", spec=m.spec, created_at=T0, updated_at=T0)
    cluster = ZeroCluster(policy, lambda t: 0.0 if front_load(t) < 5 else load_curve(t), front_load)
    loops = [AutomationLoop(cluster, clock=lambda: cluster.now)]

    async def live() -> None:
        for k in range(200):
            if k == 70:  # restarted while idle: the idle window comes back from the log
                loops.append(AutomationLoop(cluster, clock=lambda: cluster.now))
            cluster.now = T0 + k * STEP
            cluster.record_bucket(cluster.now)
            await loops[-1].run_once()

    asyncio.run(live())
    acted = [(d["ts"], d["action"]["from"], d["action"]["to"]) for d in cluster.decisions if d["outcome"] == "acted"]
    assert any(to == 0 for _, _, to in acted) and any(fr == 0 for _, fr, _ in acted), acted  # to zero and back

    spec = m.spec.autoscale
    assert spec is not None
    steps = steps_from_series(spec, [Series(k, tuple(p)) for k, p in cluster.points.items()], T0, T0 + 199 * STEP,
                              STEP, STEP, [Series("front", tuple(cluster.front_points))])
    replayed = simulate(spec, steps, 1)
    assert replayed.actions() == acted
    live_rows = [(d["rawDesired"], d["desired"], d["heldBy"]) for d in cluster.decisions]
    assert [(s.verdict.raw_desired, s.verdict.desired, s.verdict.held_by) for s in replayed.decisions] == live_rows
    assert report(spec, replayed, STEP)["replicas"]["min"] == 0
