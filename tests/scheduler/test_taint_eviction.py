"""NoExecute taint eviction: the pure decision (taint_eviction_cases.yaml), then on a replica:
an untolerated NoExecute taint moves an instance off at once, tolerationSeconds after that long,
a toleration without seconds keeps it; each move is a Relocating event with reason TaintEviction."""

from __future__ import annotations

import time
from typing import Any

import pytest

from persys.model import Node, Phase, Taint, parse_manifests
from persys.model.workload import Toleration
from persys.scheduler.mirror.reports import WorkloadReport
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.work import taint_eviction
from tests.cases import load
from tests.scheduler.test_core import manifest, node
from tests.scheduler.test_node_ops import s, until  # noqa: F401  (the replica fixture)


async def report(sched: Scheduler, node_id: str, running: list[str]) -> None:
    """The node's agent runs exactly these (a complete report)."""
    await sched.agent_api.report(node_id, [WorkloadReport(i, sched.state.workloads[i].value.revision, 1, Phase.RUNNING)
                                 for i in running], complete=True)


CASES = load(__file__, "taint_eviction_cases.yaml")["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_eviction_case(case: dict[str, Any]) -> None:
    n = Node(id="n1", registered_at=case["node"]["registered_at"],
             taints=[Taint.model_validate(t) for t in case["node"]["taints"]])
    tolerations = [Toleration.model_validate(t) for t in case["tolerations"]]
    got = taint_eviction.eviction(n, tolerations)
    if case["expect"] is None:
        assert got is None
    else:
        assert got is not None and got.due == case["expect"]["due"] and str(got.taint) == case["expect"]["taint"]


def test_toleration_seconds_need_no_execute() -> None:
    with pytest.raises(ValueError, match="tolerationSeconds: only with effect NoExecute"):
        Toleration.model_validate({"key": "a", "operator": "Exists", "tolerationSeconds": 5})


async def test_no_execute_evicts_now_after_toleration_seconds_or_never(s: Scheduler) -> None:  # noqa: F811
    await s.agent_api.register(node("n1"))
    await s.agent_api.register(node("n2"))
    await s.node_api.cordon("n2")
    tol = "  tolerations: [{{key: maint, operator: Exists, effect: NoExecute{}}}]\n"
    for name, extra in (("web", ""), ("db", tol.format(", tolerationSeconds: 1")), ("keep", tol.format(""))):
        await s.workload_api.apply(parse_manifests(manifest(name, extra=extra))[0])
    await until(lambda: all(s.state.placement_of.get(w) == "n1" for w in ("web", "db", "keep")))
    await report(s, "n1", ["web", "db", "keep"])
    await s.node_api.cordon("n2", on=False)
    tainted = time.time()
    await s.node_api.taint("n1", [Taint(key="maint", value="yes", effect="NoExecute")], [])
    assert s.state.nodes["n1"].value.admin_taints[0].added_at >= tainted  # when it was added
    await until(lambda: "web" not in s.state.placement_of)  # withdrawn from n1 at once
    assert s.state.placement_of["db"] == "n1", "tolerated for 1 s"
    await report(s, "n1", ["db", "keep"])  # n1's agent stopped web: it is placed on n2
    await until(lambda: s.state.placement_of.get("web") == "n2")
    await until(lambda: "db" not in s.state.placement_of, within=5)  # by the timer, 1 s after the taint
    await report(s, "n1", ["keep"])
    await until(lambda: s.state.placement_of.get("db") == "n2")
    assert time.time() - tainted >= 1.0
    assert s.state.placement_of["keep"] == "n1"  # tolerated as long as the taint stays
    events = [e for e in await s.events.recent(100) if e.kind == "Relocating"]
    assert {e.message.split(":")[0] for e in events if e.reason == "TaintEviction"} >= {"web"}
    assert any("has taint maint=yes:NoExecute" in e.message for e in events)
