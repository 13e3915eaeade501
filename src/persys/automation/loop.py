"""The automation loop: the edge around the pure decisions. Each pass reads the policies and the
pause switch, evaluates each policy whose interval is due (reading the meter and the store
through the client API), acts through the same API as the automation's own identity, and
records every decision, including "do nothing", in one call.

What a decision remembers (its recent recommendations and actions) is rebuilt from the decision
log the first time a policy is seen, so a restarted automation keeps its windows and cooldowns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from persys.automation import autoscale as asc
from persys.automation import prometheus_source
from persys.automation.leadership import Leadership
from persys.automation.observe import WindowFigure, fresh_total, series_of, window_figure
from persys.automation.rebalance_run import RebalanceLoop
from persys.automation.remediate_run import RemediateLoop
from persys.automation.seams import AutomationApi, DiskForecasts, IntelligenceSignals
from persys.client import SchedulerError
from persys.model.automation import Autoscale, Decision, Evidence, Outcome, Policy, Sort

log = logging.getLogger(__name__)
METER_STEP = 10  # the meter's finest step: an autoscale window's figure from 10 s buckets
HISTORY_LIMIT = 5_000


@dataclass
class PolicyState:
    due: float = 0.0
    history: asc.History = field(default_factory=asc.History)
    loaded: bool = False
    scraped: tuple[float, float] | None = None  # metric prometheus: the last good (time, total)


def scaled_manifest(workload: dict[str, Any], replicas: int, to_zero: bool = False) -> dict[str, Any]:
    """The workload's manifest as stored, with another replica count. With `to_zero` (a policy
    with scaleToZero), zero is the workload stopped at one replica (Persys workloads have at least
    one; a stopped one runs nothing and keeps its place), any other count runs."""
    spec = {**workload["spec"], "replicas": max(replicas, 1)}
    if to_zero:
        spec["desiredState"] = "Stopped" if replicas == 0 else "Running"
    return {"apiVersion": "persys.dev/v1", "kind": "Workload",
            "metadata": {"name": workload["name"], "labels": workload.get("labels", {})}, "spec": spec}


def current_replicas(workload: dict[str, Any], to_zero: bool) -> int:
    """The count a policy scales from: a stopped workload is at zero for a scaleToZero policy."""
    if to_zero and workload.get("desiredState") == "Stopped":
        return 0
    return int(workload["replicas"])


def history_from_log(decisions: list[dict[str, Any]]) -> asc.History:
    """The recommendations and the actions done, from recorded decisions (a dry run's actions
    were not done: they consume no cooldown and no rate)."""
    recs, acts = [], []
    for d in decisions:
        rec = (d.get("inputs") or {}).get("recommendation")
        if isinstance(rec, int):
            recs.append(asc.Recommendation(float(d["ts"]), rec))
        a = d.get("action") or {}
        if d.get("outcome") == Outcome.ACTED.value and a.get("type") == "scale":
            acts.append(asc.Action(float(d["ts"]), int(a["from"]), int(a["to"])))
    return asc.History(tuple(recs), tuple(acts))


class AutomationLoop:
    def __init__(self, api: AutomationApi, clock: Callable[[], float] = time.time, tick: float = 1.0,
                 signals: IntelligenceSignals | None = None, leadership: Leadership | None = None,
                 disk: DiskForecasts | None = None) -> None:
        self.api = api
        self.clock = clock
        self.tick = tick
        self.signals = signals  # Persys Intelligence, when present (docs/automation.md)
        # One automation per cluster (leadership.py); None: this loop is the only one (tests).
        self.leadership = leadership
        self.states: dict[str, PolicyState] = {}
        self.remediate = RemediateLoop(api, self.may_act, signals, disk)
        self.rebalance = RebalanceLoop(api, self.may_act)
        self.passes = 0
        self.standby_passes = 0

    def may_act(self) -> bool:
        return self.leadership is None or self.leadership.valid()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.run_once()
            except SchedulerError as err:  # the API is down or refuses: try again next tick
                log.warning("automation pass failed: %s", err)
            except Exception:  # a bug must not end the automation silently
                log.exception("automation pass failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.tick)
        if self.leadership is not None:
            await self.leadership.release()  # the standby takes over at once, not after the TTL

    async def run_once(self) -> list[dict[str, Any]]:
        """One pass: the decisions of every policy that was due, recorded (their ids set)."""
        if self.leadership is not None and not await self.leadership.ensure():
            self.standby_passes += 1  # another automation leads: decide nothing, record nothing
            return []
        now = self.clock()
        listing = await self.api.list_automation_policies()
        pause = listing.get("pause") or {}
        policies = [Policy.model_validate(_stored(p)) for p in listing.get("items", [])]
        self.states = {p.name: self.states.get(p.name, PolicyState()) for p in policies}
        out: list[Decision] = []
        for p in policies:
            st = self.states[p.name]
            if now < st.due:
                continue
            st.due = now + p.spec.interval()
            out += await self._decide(p, st, now, pause)
        docs = [d.to_doc() for d in out]
        if docs:
            for doc, did in zip(docs, await self.api.record_decisions(docs), strict=True):
                doc["id"] = did
        self.passes += 1
        return docs

    async def _decide(self, p: Policy, st: PolicyState, now: float, pause: dict[str, Any]) -> list[Decision]:
        base: dict[str, Any] = {"ts": now, "policy": p.name, "policy_version": p.version, "sort": p.spec.sort,
                "dry_run": p.spec.dry_run, "runner": self.leadership.holder if self.leadership else ""}
        if pause.get("paused") or p.spec.paused:
            why = (f"all automation paused by {pause.get('by', '?')}" if pause.get("paused")
                   else f"policy paused (version {p.version})")
            return [Decision(**base, held_by="paused", outcome=Outcome.PAUSED, reason=why)]
        try:
            if p.spec.sort == Sort.AUTOSCALE:
                return [await self._autoscale(p, st, now, base)]
            if p.spec.sort == Sort.REMEDIATE:
                return await self.remediate.decide(p, now, base)
            return await self.rebalance.decide(p, now, base)
        except SchedulerError as err:
            return [Decision(**base, outcome=Outcome.FAILED, reason=f"{err.code}: {err.message}"[:1000])]

    async def _figure(self, spec: Autoscale, st: PolicyState, now: float, cur: int, instances: set[str]
                      ) -> tuple[WindowFigure, list[Evidence]]:
        """The workload's figure: from the meter (cpu, memory) or its own Prometheus endpoint."""
        if spec.prometheus is not None:
            src = spec.prometheus
            total = await prometheus_source.scrape(src)
            if total is not None:
                st.scraped = (now, total)
            ev = Evidence(source="prometheus", query={"url": src.url[:500], "name": src.name,
                                                      **{f"label.{k}": v for k, v in src.labels.items()}},
                          start=st.scraped[0] if st.scraped else 0.0, end=now)
            if st.scraped is None:
                return WindowFigure(None, None, 0), [ev]
            # The endpoint speaks for the workload as a whole: every current replica "reports".
            return WindowFigure(st.scraped[1], st.scraped[0], cur), [ev]
        since = spec.metric_window_seconds + METER_STEP
        answer = await self.api.meter_query("workload", spec.workload, spec.metric, since, METER_STEP, "avg")
        fig = window_figure(series_of(answer), now, spec.metric_window_seconds, spec.metric, METER_STEP, instances)
        return fig, [Evidence(source="meter", query={"selector": "workload", "value": spec.workload,
                                                     "metric": spec.metric, "step": METER_STEP, "agg": "avg"},
                              start=float(answer.get("start", now - since)), end=float(answer.get("end", now)))]

    async def _activation(self, spec: Autoscale, now: float, own: WindowFigure, evidence: list[Evidence]
                          ) -> float | None:
        """scaleToZero's figure: the activation workload's metric summed over its instances
        (the policy's own figure when it names no other), None when missing or stale."""
        z = spec.scale_to_zero
        assert z is not None
        workload, metric = z.activation_workload or spec.workload, z.activation_metric or spec.metric
        if (workload, metric) == (spec.workload, spec.metric) or metric == "prometheus":
            return fresh_total(own, now, spec.stale_after_seconds)
        since = spec.metric_window_seconds + METER_STEP
        answer = await self.api.meter_query("workload", workload, metric, since, METER_STEP, "avg")
        evidence.append(Evidence(source="meter", query={"selector": "workload", "value": workload, "metric": metric,
                                                        "step": METER_STEP, "agg": "avg"},
                                 start=float(answer.get("start", now - since)), end=float(answer.get("end", now))))
        fig = window_figure(series_of(answer), now, spec.metric_window_seconds, metric, METER_STEP)
        return fresh_total(fig, now, spec.stale_after_seconds)

    async def _history(self, p: Policy, st: PolicyState, now: float) -> asc.History:
        assert p.spec.autoscale is not None
        if not st.loaded:
            horizon = asc.memory_horizon(p.spec.autoscale)
            st.history = history_from_log(await self.api.list_decisions(p.name, now - horizon, HISTORY_LIMIT))
            st.loaded = True
        return st.history

    async def _autoscale(self, p: Policy, st: PolicyState, now: float, base: dict[str, Any]) -> Decision:
        spec = p.spec.autoscale
        assert spec is not None
        hist = await self._history(p, st, now)
        try:
            w = await self.api.get_workload(spec.workload)
        except SchedulerError as err:
            if err.code != "NOT_FOUND":
                raise
            return Decision(**base, outcome=Outcome.NONE, reason=f"workload {spec.workload} not found")
        to_zero = spec.scale_to_zero is not None
        cur = current_replicas(w, to_zero)
        instances = {i["instance"] for i in w.get("instances", [])[:cur]}
        fig, evidence = await self._figure(spec, st, now, cur, instances)
        evidence.append(Evidence(source="store", ref=f"workload/{spec.workload}@{w.get('revision', '')}"))
        activation = await self._activation(spec, now, fig, evidence) if to_zero else None
        v = asc.decide(spec, asc.Observation(now, cur, fig.total, fig.newest, fig.reporting, activation), hist)
        inputs = {"metric": spec.metric, "target": spec.target, "currentReplicas": cur, "total": fig.total,
                  "perReplica": v.per_replica, "reporting": fig.reporting,
                  "newestAge": None if fig.newest is None else round(now - fig.newest, 1),
                  "windowSeconds": spec.metric_window_seconds, "recommendation": v.recommendation,
                  **({"activation": activation} if to_zero else {})}
        action = None
        outcome = Outcome.NONE
        reason = v.reason
        done: asc.Action | None = None
        if v.desired != cur:
            action = {"type": "scale", "workload": spec.workload, "from": cur, "to": v.desired}
            if p.spec.dry_run:
                outcome = Outcome.DRY_RUN
            elif not self.may_act():
                outcome, reason = Outcome.NONE, f"{reason}; not scaled: this automation lost its lease"
                v = dataclasses.replace(v, held_by="lease")
            else:
                try:
                    await self.api.apply(scaled_manifest(w, v.desired, to_zero))
                    outcome, done = Outcome.ACTED, asc.Action(now, cur, v.desired)
                except SchedulerError as err:
                    outcome, reason = Outcome.FAILED, f"{reason}; apply refused: {err.code}: {err.message}"
        st.history = hist.after(now, v.recommendation, done).trimmed(now, asc.memory_horizon(spec))
        return Decision(**base, inputs=inputs, evidence=evidence, raw_desired=v.raw_desired, desired=v.desired,
                        held_by=v.held_by, action=action, outcome=outcome, reason=reason[:1000])


def _stored(view: dict[str, Any]) -> dict[str, Any]:
    """A policy as listed (its view adds `sort`) as the stored model reads it."""
    return {k: v for k, v in view.items() if k != "sort"}
