"""Queueing hints: the table (queueing_hint_cases.yaml), then on a replica: a node change
re-enqueues only the Pending workloads it could help; the periodic retry still sees every one."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model import Capabilities, Node, NodeStatus, RuntimeInfo, Taint, WorkloadStatus, parse_manifests
from persys.scheduler.placing import queueing_hints
from persys.scheduler.replica.assembly import Scheduler
from tests.cases import load
from tests.scheduler.test_core import manifest, node
from tests.scheduler.test_node_ops import s, until  # noqa: F401  (the replica fixture)

CASES = load(__file__, "queueing_hint_cases.yaml")["cases"]


def node_of(d: dict[str, Any] | None) -> Node | None:
    if d is None:
        return None
    taints = []
    for t in d.get("taints", []):
        head, effect = t.rsplit(":", 1)
        key, _, value = head.partition("=")
        taints.append(Taint(key=key, value=value, effect=effect))
    caps = Capabilities(runtimes={r: RuntimeInfo() for r in d.get("runtimes", ["process"])},
                        storage_drivers=d.get("drivers", ["local"]), cpu_millicores=d.get("cpu", 1000),
                        memory_mb=d.get("memory", 1000), disk_mb=1000)
    return Node(id="n", capabilities=caps, labels=d.get("labels", {}), taints=taints,
                status=NodeStatus.READY if d.get("ready", True) else NodeStatus.NOT_READY,
                cordoned=d.get("cordoned", False))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_hint_case(case: dict[str, Any]) -> None:
    old, new = node_of(case["old"]), node_of(case["new"])
    lifted = queueing_hints.lifted(queueing_hints.NodeFacts.of(old) if old else None,
                                   queueing_hints.NodeFacts.of(new) if new else None)
    assert sorted(lifted) == sorted(case["lifted"])
    if "pending" in case:
        statuses = {i: WorkloadStatus(reason="Unschedulable" if codes is not None else "Relocating",
                                      placement={"codes": codes} if codes is not None else {})
                    for i, codes in case["pending"].items()}
        assert queueing_hints.helped(sorted(statuses), statuses, lifted) == case["again"]


async def test_a_node_change_looks_again_only_at_what_it_could_help(s: Scheduler) -> None:  # noqa: F811
    await s.agent_api.register(node("n1", cpu=1000, runtimes=("process",)))
    await s.workload_api.apply(parse_manifests(manifest("big", cpu=3000))[0])  # insufficient cpu
    await s.workload_api.apply(parse_manifests(manifest("ctr", type_="container"))[0])  # no container runtime
    await until(lambda: all(s.state.statuses[w].value.reason == "Unschedulable" for w in ("big", "ctr")))
    assert s.state.statuses["big"].value.placement["codes"] == ["insufficient_cpu"]
    s.config.pending_retry_seconds = 3600  # the safety net out of the way: only hints re-enqueue
    await until(lambda: not s.monitor.pending_dirty and not s.hints.hinted)  # n1's arrival (all) taken
    looked: list[tuple[frozenset[str], list[str]]] = []  # (codes lifted, instances looked at again)
    real = s.enqueue_pending

    def spy(hinted: frozenset[str] | None = None) -> None:
        if hinted is not None:
            statuses = {i: st.value for i in s.state.pending if (st := s.state.statuses.get(i)) is not None}
            looked.append((hinted, queueing_hints.helped(sorted(s.state.pending), statuses, hinted)))
        real(hinted)

    s.enqueue_pending = spy  # type: ignore[method-assign]
    await s.node_api.label("n1", {"zone": "a"}, [])  # labels lift neither cpu nor runtime refusals
    await until(lambda: any("node_selector_mismatch" in h for h, _ in looked))
    assert [again for h, again in looked if "node_selector_mismatch" in h] == [[]], looked
    await s.agent_api.register(node("n1", cpu=4000, runtimes=("process",)))  # more room: big fits now
    await until(lambda: s.state.placement_of.get("big") == "n1")
    assert ["big"] in [again for h, again in looked if "insufficient_cpu" in h]
    assert all("ctr" not in again for _, again in looked)
    assert s.state.statuses["ctr"].value.reason == "Unschedulable"
