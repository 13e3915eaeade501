"""Replay: an autoscale policy's pure decision run over a sequence of observations, as the live
loop would have run it (`simulate`), and what it would have done (`report`): actions per hour,
flaps, time over target. Pure.

Over past meter data (`steps_from_series`) the load is what the instances used then, summed: the
replicas the policy would have set share that total (HPA's assumption: the work is the same,
spread over more or fewer replicas). The loop and replay compute the figure with the same
function (`observe.window_figure`), so on the same samples they take the same decisions.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from persys.automation.autoscale import Action, History, Observation, Verdict, decide, memory_horizon
from persys.automation.observe import Series, fresh_total, window_figure
from persys.model.automation import Autoscale

MIN_FLAP_SECONDS = 60


def flap_seconds(spec: Autoscale) -> int:
    """An action reversing the previous one within this long is a flap: the longer stabilisation
    window (a reversal the windows let through quickly), at least a minute."""
    return max(MIN_FLAP_SECONDS, spec.stabilization.down_seconds, spec.stabilization.up_seconds)
STEPS = (10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21_600, 86_400)  # the meter's whole-table steps
MAX_POINTS = 5_000


@dataclass(frozen=True)
class Step:
    ts: float
    total: float | None
    newest: float | None
    reporting: int | None = None  # None: as many as the replicas at that time (a simulation)
    activation: float | None = None  # scaleToZero's figure (fresh), None: missing or stale


@dataclass(frozen=True)
class Simulated:
    ts: float
    current: int
    verdict: Verdict
    acted: bool


@dataclass
class Replay:
    decisions: list[Simulated] = field(default_factory=list)

    def actions(self) -> list[tuple[float, int, int]]:
        return [(d.ts, d.current, d.verdict.desired) for d in self.decisions if d.acted]


def step_for(range_seconds: float, interval: int) -> int:
    """The finest meter step that keeps a series within its point bound and is not finer than
    the policy's interval (a step whose table divides it: meter/query.py)."""
    need = max(interval, range_seconds / MAX_POINTS)
    return next((s for s in STEPS if s >= need), STEPS[-1])


def simulate(spec: Autoscale, steps: Sequence[Step], start_replicas: int, history: History | None = None
             ) -> Replay:
    current, hist = start_replicas, history or History()
    horizon = memory_horizon(spec)
    out = Replay()
    for st in steps:
        obs = Observation(st.ts, current, st.total, st.newest, current if st.reporting is None else st.reporting,
                          activation=st.activation)
        v = decide(spec, obs, hist)
        acted = v.desired != current
        hist = hist.after(st.ts, v.recommendation, Action(st.ts, current, v.desired) if acted else None)
        hist = hist.trimmed(st.ts, horizon)
        out.decisions.append(Simulated(st.ts, current, v, acted))
        current = v.desired
    return out


def steps_from_series(spec: Autoscale, series: Sequence[Series], start: float, end: float, interval: int,
                      step: int, activation: Sequence[Series] | None = None) -> list[Step]:
    """One observation every `interval` from `start` to `end` (the series at the meter `step`).
    With scaleToZero, each carries the activation figure as the live loop computes it: from the
    `activation` workload's series when the policy names another workload or metric, else the
    policy's own figure; either only while fresh (staleAfterSeconds)."""
    steps = []
    t = start
    window = max(spec.metric_window_seconds, step)
    z = spec.scale_to_zero
    metric = (z.activation_metric if z is not None else None) or spec.metric
    while t <= end:
        fig = window_figure(series, t, window, spec.metric, step)
        act = None
        if z is not None:
            afig = fig if activation is None else window_figure(activation, t, window, metric, step)
            act = fresh_total(afig, t, spec.stale_after_seconds)
        steps.append(Step(t, fig.total, fig.newest, activation=act))
        t += interval
    return steps


def report(spec: Autoscale, replay: Replay, interval: int) -> dict[str, Any]:
    acts = replay.actions()
    span = (replay.decisions[-1].ts - replay.decisions[0].ts + interval) if replay.decisions else 0.0
    flaps, within = 0, flap_seconds(spec)
    for prev, cur in itertools.pairwise(acts):
        if (cur[2] - cur[1]) * (prev[2] - prev[1]) < 0 and cur[0] - prev[0] <= within:
            flaps += 1
    over = sum(interval for d in replay.decisions
               if d.verdict.per_replica is not None and d.verdict.per_replica > spec.target * (1 + spec.tolerance.up))
    held: dict[str, int] = {}
    for d in replay.decisions:
        held[d.verdict.held_by or "none"] = held.get(d.verdict.held_by or "none", 0) + 1
    return {
        "decisions": len(replay.decisions),
        "actions": len(acts),
        "actionsPerHour": round(len(acts) * 3600 / span, 3) if span else 0.0,
        "flaps": flaps,
        "flapSeconds": within,
        "secondsOverTarget": over,
        "fractionOverTarget": round(over / span, 4) if span else 0.0,
        "heldBy": held,
        "replicas": {"min": min((d.verdict.desired for d in replay.decisions), default=0),
                     "max": max((d.verdict.desired for d in replay.decisions), default=0)},
        "actionList": [{"ts": ts, "from": a, "to": b} for ts, a, b in acts[:500]],
    }
