"""Preemption through a replica: a Pending workload of a higher priority moves a lower one off
the node it needs, in one transaction (it is placed there, the victim is Pending, Preempted, and
moves elsewhere once its agent stopped it); equal priority never preempts; events name both and
the metric counts the victims. The pure choice is in whatif_cases/preemption.yaml."""

from __future__ import annotations

from persys.model import Phase, parse_manifests
from persys.scheduler.mirror.reports import WorkloadReport
from persys.scheduler.replica.assembly import Scheduler
from tests.scheduler.test_core import manifest, node
from tests.scheduler.test_node_ops import s, until, until_event  # noqa: F401  (the replica fixture)


async def test_a_higher_priority_preempts_a_lower_one(s: Scheduler) -> None:  # noqa: F811
    await s.agent_api.register(node("n1", cpu=2000))
    await s.workload_api.apply(parse_manifests(manifest("low", cpu=1500))[0])
    await until(lambda: s.state.placement_of.get("low") == "n1")
    rev = s.state.workloads["low"].value.revision
    await s.agent_api.report("n1", [WorkloadReport("low", rev, 1, Phase.RUNNING)], complete=True)
    await s.workload_api.apply(parse_manifests(manifest("peer", cpu=1500, extra="  priority: 0\n"))[0])
    await until(lambda: s.state.statuses["peer"].value.reason == "Unschedulable")  # equal: no preemption
    assert s.state.placement_of["low"] == "n1"

    await s.workload_api.apply(parse_manifests(manifest("urgent", cpu=1500, extra="  priority: 100\n"))[0])
    await until(lambda: s.state.placement_of.get("urgent") == "n1")
    low = s.state.statuses["low"].value
    assert "low" not in s.state.placement_of and low.reason == "Preempted" and low.relocating_from == "n1"
    assert "preempted on n1 by urgent (priority 100)" in low.message
    await until_event(s, "Preempted")  # published after the commit, by the outbox's own task
    kinds = {e.kind: e.message for e in await s.events.recent(100)}
    assert kinds["Preempting"] == "urgent (priority 100) preempted low (priority 0) on n1"
    assert kinds["Preempted"] == "low: preempted on n1 by urgent (priority 100)"
    explained = s.workload_api.explain("urgent")["replicas"][0]["explanation"]
    assert explained.startswith("placed on n1") and "preempted low (priority 0) on n1 (priority 100)" in explained
    assert "persys_preemptions_total 1" in s.metrics.metrics.exposition().decode()

    await s.agent_api.report("n1", [], complete=True)  # the agent stopped low: it needs room elsewhere
    await s.agent_api.register(node("n2", cpu=2000))
    await until(lambda: s.state.placement_of.get("low") == "n2" or s.state.placement_of.get("peer") == "n2")
    assert s.state.placement_of["urgent"] == "n1"  # never preempted back
