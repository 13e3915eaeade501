"""The remediate policy at the edge: reads failures (WorkloadFailed events naming their node),
nodes and failed instances through the client API, plans with the pure `remediate.plan`, and
cordons or restarts as the automation's identity. What it did is rebuilt from its decision log."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from persys.automation import remediate as rm
from persys.automation.rebalance_run import node_local_data
from persys.automation.seams import AutomationApi, DiskForecasts, IntelligenceSignals
from persys.client import SchedulerError
from persys.model.automation import Decision, Evidence, Outcome, Policy, Remediate

EVENTS_READ = 1_000
DONE_LOOKBACK = 7 * 86_400
MAX_FULL_NODES = 8  # filling nodes looked at per evaluation
MAX_WORKLOADS = 50  # workloads read per filling node


class RemediateLoop:
    def __init__(self, api: AutomationApi, may_act: Callable[[], bool] = lambda: True,
                 signals: IntelligenceSignals | None = None, disk: DiskForecasts | None = None) -> None:
        self.api = api
        self.may_act = may_act  # still the cluster's one automation (leadership.py)
        self.signals = signals
        self.disk = disk  # Persys Intelligence's disk forecasts, when present (relocateOnDiskFilling)
        self.done: dict[str, list[rm.Done]] = {}

    async def _done(self, policy: str, now: float) -> list[rm.Done]:
        if policy not in self.done:
            log = await self.api.list_decisions(policy, now - DONE_LOOKBACK, 5_000, "acted")
            self.done[policy] = [rm.Done(float(d["ts"]), d["action"]["type"], d["action"]["target"])
                                 for d in log if d.get("action") and "target" in d["action"]]
        return self.done[policy]

    async def decide(self, p: Policy, now: float, base: dict[str, Any]) -> list[Decision]:
        spec = p.spec.remediate
        assert spec is not None
        events = await self.api.events(EVENTS_READ)
        failures = [rm.Failure(float(e["ts"]), e.get("fields", {}).get("node", ""),
                               e.get("subject", "").removeprefix("workload/"), str(e.get("id", "")))
                    for e in events if e.get("kind") == "WorkloadFailed" and e.get("fields", {}).get("node")]
        nodes = [rm.NodeView(n["id"], bool(n.get("cordoned"))) for n in await self.api.list_nodes()]
        failed = await self._failed_instances() if spec.restart_unhealthy else []
        done = await self._done(p.name, now)
        full, placed, disk_note = await self._disk(spec, now)
        planned = rm.plan(spec, now, failures, nodes, failed, done, full, placed)
        evidence = [Evidence(source="events", query={"kind": "WorkloadFailed", "limit": EVENTS_READ},
                             start=now - spec.failure_window_seconds, end=now)]
        if not planned:
            inputs = {"failures": len(failures), "nodes": len(nodes), "failedInstances": len(failed),
                      "diskFilling": disk_note}
            return [Decision(**base, evidence=evidence, inputs=inputs,
                             outcome=Outcome.NONE, reason="no node over its failure count, no failed instance"
                             + ("" if spec.relocate_on_disk_filling is None else ", no disk forecast full"))]
        out = []
        for pl in planned:
            action = {"type": pl.type, "target": pl.target}
            ev = evidence + [Evidence(source="intelligence" if pl.evidence_source == "intelligence" else "events",
                                      ref=i) for i in pl.evidence[:8]]
            outcome, reason = await self._carry_out(p, pl, now, done)
            inputs = {"failures": len(failures), **({"diskFilling": disk_note} if pl.evidence_source ==
                                                     "intelligence" else {})}
            out.append(Decision(**base, evidence=ev, inputs=inputs, held_by=pl.held_by,
                                action=action, outcome=outcome, reason=reason[:1000]))
        return out

    async def _failed_instances(self) -> list[rm.FailedInstance]:
        """The Failed instances of workloads meant to run."""
        failed = []
        for w in await self.api.list_workloads():
            if w.get("desiredState") != "Running":
                continue
            for i in w.get("instances", []):
                if i.get("phase") == "Failed":
                    failed.append(rm.FailedInstance(w["id"], i["instance"], i.get("node") or "",
                                                    str(i.get("reason") or i.get("message") or "")[:200]))
        return failed

    async def _carry_out(self, p: Policy, pl: rm.Planned, now: float, done: list[rm.Done]) -> tuple[Outcome, str]:
        """A planned action done (and recorded in `done`), or why not: held, a dry run, no lease."""
        if pl.held_by:
            return Outcome.NONE, pl.reason
        if p.spec.dry_run:
            return Outcome.DRY_RUN, pl.reason
        if not self.may_act():
            return Outcome.NONE, f"{pl.reason}; not done: this automation lost its lease"
        outcome, reason = await self._act(pl)
        if outcome == Outcome.ACTED:
            done.append(rm.Done(now, pl.type, pl.target))
        return outcome, reason

    async def _disk(self, spec: Remediate, now: float) -> tuple[list[rm.Filling], list[rm.Placed], str]:
        """The nodes Intelligence forecasts full, the instances on them, and what was read."""
        if spec.relocate_on_disk_filling is None:
            return [], [], "off"
        if self.disk is None:
            return [], [], "no source: Persys Intelligence's disk forecasts are not available to this automation"
        dfs = spec.relocate_on_disk_filling
        forecasts = await self.disk.disk_forecasts(float(dfs.history_hours) * 3600, float(dfs.within_hours) * 3600)
        full = rm.filling(spec.relocate_on_disk_filling, now, forecasts)
        placed: list[rm.Placed] = []
        for f in full[:MAX_FULL_NODES]:
            for w in (await self.api.list_workloads(f.node))[:MAX_WORKLOADS]:
                detail = await self.api.get_workload(w["id"])
                local = node_local_data(detail.get("spec") or {})
                placed += [rm.Placed(detail["name"], i["instance"], i["node"], local)
                           for i in detail.get("instances", []) if i.get("node") == f.node
                           and i.get("phase") != "Pending"]
        verdicts = Counter(str((f.get("forecast") or {}).get("verdict", "?")) for f in forecasts)
        read = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
        return full, placed, f"{len(forecasts)} node forecasts read ({read}), {len(full)} full within the horizon"

    async def _act(self, pl: rm.Planned) -> tuple[Outcome, str]:
        try:
            if pl.type == "cordon":
                await self.api.cordon(pl.target, True)
            elif pl.type == "relocate":  # one instance off a node whose disk is filling
                workload, _, instance = pl.target.partition("/")
                r = await self.api.move_instance(workload, instance)
                return Outcome.ACTED, f"{pl.reason}; moving {r['instance']} {r['from']} -> {r['to']}"
            else:
                await self.api.control(pl.target, "restart")
        except SchedulerError as err:
            return Outcome.FAILED, f"{pl.reason}; refused: {err.code}: {err.message}"
        return Outcome.ACTED, pl.reason
