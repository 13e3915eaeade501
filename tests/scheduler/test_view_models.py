"""Every view a replica shows validates against its declared model (view_models.py) with no
undeclared field, so the gateway's OpenAPI response schemas say what the API really sends."""

from __future__ import annotations

from collections.abc import Callable

from persys.model import NodeUsage, Phase, parse_manifests
from persys.model.status import WorkloadUsage
from persys.scheduler.api import replay
from persys.scheduler.mirror.reports import WorkloadReport
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.rules import revisions
from persys.scheduler.views import models as vm
from tests.scheduler import test_core
from tests.scheduler.test_core import manifest, node, settle

make, clock = test_core.make, test_core.clock  # the same scheduler fixtures (pytest finds them here)


async def test_views_match_their_models(make: Callable) -> None:
    s: Scheduler = await make()
    await s.agent_api.register(node("n1"))
    s.agent_api.heartbeat("n1", NodeUsage(cpu_percent=3))
    (m,) = parse_manifests(manifest("web").replace("spec:\n", "spec:\n  replicas: 2\n"))
    await s.workload_api.apply(m)
    await settle(s, lambda: s.state.placement_of.get("web") == "n1" and s.state.placement_of.get("web.1") == "n1")
    rev = s.state.workloads["web"].value.revision
    await s.agent_api.report("n1", [WorkloadReport("web", rev, 1, Phase.RUNNING, usage=WorkloadUsage(cpu_percent=2.5)),
                          WorkloadReport("web.1", rev, 1, Phase.STOPPED)], complete=True)
    await s.node_api.drain("n1", 0)

    w = vm.WorkloadView.model_validate(s.workload_view("web"))
    assert w.spec is not None and len(w.instances) == 2 and w.instances[0].usage.cpu_percent == 2.5
    assert w.drift and w.drift[0].kind == "unexpected-stop"
    assert vm.WorkloadView.model_validate(s.workload_view("web", summary=True)).spec is None
    n = vm.NodeView.model_validate(s.node_view("n1"))
    assert n.allocated.workloads == 2 and n.draining
    assert vm.DrainStatus.model_validate(s.drain_status("n1")).node == "n1"
    assert vm.Explanation.model_validate(s.workload_api.explain("web", "n1")).replicas[0].decision.scores
    at = s.state.statuses["web"].value.placement["seen"]["rev"]
    assert vm.ReplayView.model_validate(await replay.replay(s.state, s.placement.config, "web", at)).agrees
    h = vm.Health.model_validate(await s.health())
    assert h.active and h.liveness.judged_nodes >= 0
    # A new request (a replica count alone keeps the revision): a second revision.
    two = manifest("web", cpu=150).replace("spec:\n", "spec:\n  replicas: 2\n")
    await s.workload_api.apply(parse_manifests(two)[0])
    history = revisions.history(await s.workload_api.revisions("web"))
    listed = vm.RevisionList.model_validate({"workload": "web", "items": history})
    assert [r.generation for r in listed.items] == [1, 2] and listed.items[-1].current
    assert listed.items[0].change == "created" and listed.items[0].rollback_of is None
    # camelCase on the wire, as the views send it
    assert "observedRevision" in vm.InstanceView.model_json_schema(by_alias=True)["properties"]
