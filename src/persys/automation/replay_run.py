"""`persysctl policy replay P --since 7d` at the edge: the policy and its workload through the
client API, the workload's meter history at a step the meter can serve, then the pure replay."""

from __future__ import annotations

import asyncio
from typing import Any

from persys.automation.loop import current_replicas
from persys.automation.observe import series_of
from persys.automation.replay import report, simulate, step_for, steps_from_series
from persys.automation.seams import AutomationApi
from persys.client import SchedulerError
from persys.model.automation import Policy

MAX_REPLAY_SECONDS = 30 * 86_400


class ReplayRefused(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


async def replay_policy(api: AutomationApi, name: str, window: float, now: float,
                        start_replicas: int | None = None) -> dict[str, Any]:
    if not 60 <= window <= MAX_REPLAY_SECONDS:
        raise ReplayRefused("since", f"{window:.0f}s is outside 1m..30d")
    view = await api.get_automation_policy(name)
    policy = Policy.model_validate({k: v for k, v in view.items() if k != "sort"})
    spec = policy.spec.autoscale
    if spec is None:
        raise ReplayRefused("name", f"policy {name} is a {policy.spec.sort.value} policy: replay runs autoscale "
                            "policies (over the meter's history)")
    if spec.prometheus is not None:
        raise ReplayRefused("name", f"policy {name} scales on a Prometheus endpoint of its own: the meter keeps no "
                            "history of it to replay")
    z = spec.scale_to_zero
    if start_replicas is None:
        try:
            start_replicas = current_replicas(await api.get_workload(spec.workload), z is not None)
        except SchedulerError as err:
            if err.code != "NOT_FOUND":
                raise
            start_replicas = spec.min_replicas
    interval = spec.interval_seconds
    step = step_for(window, interval)
    since = window + spec.metric_window_seconds
    answer = await api.meter_query("workload", spec.workload, spec.metric, since, step, "avg")
    start = float(answer.get("start", now - since))
    end = float(answer.get("end", now))
    every = max(interval, step)  # decisions every `interval` as live when the step allows it, else one per step
    series = series_of(answer)
    activation = None  # scaleToZero on the policy's own figure, as live
    evidence = [{"selector": "workload", "value": spec.workload, "metric": spec.metric, "step": step, "agg": "avg",
                 "start": start, "end": end}]
    if z is not None and (z.activation_workload or spec.workload, z.activation_metric or spec.metric) != (
            spec.workload, spec.metric):
        # The activation workload's history over the same range at the same step, as live reads it.
        aw, am = z.activation_workload or spec.workload, z.activation_metric or spec.metric
        other = await api.meter_query("workload", aw, am, since, step, "avg")
        activation = series_of(other)
        evidence.append({"selector": "workload", "value": aw, "metric": am, "step": step, "agg": "avg",
                         "start": float(other.get("start", start)), "end": float(other.get("end", end))})

    def run() -> dict[str, Any]:
        steps = steps_from_series(spec, series, start + spec.metric_window_seconds, end, every, step, activation)
        return report(spec, simulate(spec, steps, start_replicas), every)

    # Up to ~5,000 decisions of ~0.1 ms each (bench/automation_replay.py): off the event loop.
    result = await asyncio.to_thread(run)
    return {"policy": name, "version": policy.version, "workload": spec.workload, "metric": spec.metric,
            "target": spec.target, "startReplicas": start_replicas, "start": start, "end": end,
            "meterStep": step, "evidence": evidence[0], "scaleToZero": z is not None,
            "activationEvidence": evidence[1] if len(evidence) > 1 else None, **result}
