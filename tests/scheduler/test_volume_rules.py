"""Volume decisions over the mirror, pure: claims at apply (table in volume_cases/claims.yaml),
who uses a volume, reclaim with the owner's removal, and the spec agents get for claims."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model.volume import Volume, VolumeObjectSpec, VolumePhase
from persys.model.workload import Workload, WorkloadSpec
from persys.scheduler.decide.mirror import Mirror, Versioned
from persys.scheduler.mirror import keys
from persys.scheduler.rules.volumes import claim_problems, delete_refusal, reclaim_ops, users_of
from persys.scheduler.work.delivery import resolved_claims
from persys.store.base import Delete, Put
from tests.cases import load

CASES = load(__file__, "volume_cases/claims.yaml")


def spec(volumes: list[dict[str, Any]], replicas: int = 1) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"type": "process", "replicas": replicas,
                                        "process": {"command": ["true"]}, "volumes": volumes})


def workload(name: str, volumes: list[dict[str, Any]]) -> Workload:
    return Workload(id=name, name=name, spec=spec(volumes), revision="r", created_at=0, updated_at=0)


def volume(name: str, owner: str = "", phase: VolumePhase = VolumePhase.AVAILABLE, **s: Any) -> Volume:
    return Volume(id=name, spec=VolumeObjectSpec.model_validate({"driver": "local", "sizeMb": 8, **s}), owner=owner,
                  phase=phase, created_at=0, updated_at=0)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_claims(case: dict[str, Any]) -> None:
    vols = {k: volume(k, **v) for k, v in case["volumes"].items()}
    others = [workload(k, v) for k, v in case.get("workloads", {}).items()]
    got = claim_problems("new", spec(case["apply"]["volumes"], case["apply"]["replicas"]), vols, others)
    assert len(got) == len(case["problems"]), got
    for problem, expected in zip(got, case["problems"], strict=True):
        assert expected in problem


def test_users_and_delete_refusal() -> None:
    ws = [workload("a", [{"name": "d", "claim": "pg", "mountPath": "/d"}]),
          workload("web", [{"name": "data", "mountPath": "/d"}])]
    assert users_of("pg", ws) == ["a"]
    assert users_of("web-data", ws) == ["web"]  # an inline volume's record
    assert delete_refusal(volume("pg"), ["a"]) == "volume pg is used by workload a: delete or change them first"
    assert delete_refusal(volume("pg"), []) == ""


def test_reclaim_with_the_owner() -> None:
    state = Mirror()  # folded by hand: the mirror is data
    for v, rev in [(volume("web-a", owner="web", reclaimPolicy="Delete"), 5),
                   (volume("web-b", owner="web", reclaimPolicy="Retain"), 6),
                   (volume("web-c", owner="web", reclaimPolicy="Delete", phase=VolumePhase.PENDING), 7),
                   (volume("other", owner="x", reclaimPolicy="Delete"), 8)]:
        state.volumes[v.id] = Versioned(v, rev)
    compares, ops = reclaim_ops(state, "web", 1.0)
    assert sorted((c.key, c.mod_revision) for c in compares) == [
        (keys.volume("web-a"), 5), (keys.volume("web-b"), 6), (keys.volume("web-c"), 7)]
    puts = {o.key: Volume.model_validate_json(o.value) for o in ops if isinstance(o, Put)}
    assert puts[keys.volume("web-a")].phase == VolumePhase.DELETING
    assert [o.key for o in ops if isinstance(o, Delete)] == [keys.volume("web-c")]  # never provisioned
    assert keys.volume("web-b") not in puts  # retained: stays as it is


def test_agents_get_the_claimed_volume_settings() -> None:
    s = spec([{"name": "d", "claim": "pg", "mountPath": "/d"}, {"name": "e", "mountPath": "/e", "sizeMb": 3}])
    out = resolved_claims(s, {"pg": volume("pg", driver="ceph-rbd", sizeMb=64)})
    assert [(v.driver, v.size_mb, v.claim) for v in out.volumes] == [("ceph-rbd", 64, "pg"), ("local", 3, None)]
    assert s.volumes[0].size_mb == 0  # the stored spec is unchanged


def test_a_claimed_clone_carries_its_source_to_the_node() -> None:
    """Whoever provisions a clone first copies its source: for a local one, the node."""
    s = spec([{"name": "d", "claim": "restored", "mountPath": "/d"},
              {"name": "e", "claim": "plain", "mountPath": "/e"}])
    vols = {"restored": volume("restored", source={"snapshot": "orig@s1"}), "plain": volume("plain")}
    out = resolved_claims(s, vols)
    assert [v.source for v in out.volumes] == ["snapshot:orig@s1", None]


def test_a_local_clone_lives_on_its_sources_node() -> None:
    from persys.model.volume import VolumeManifest
    from persys.scheduler.rules.volumes import clone_home, source_problems

    orig = volume("orig").model_copy(update={"node": "n2"})
    never = volume("never")

    def manifest(**s: Any) -> VolumeManifest:
        return VolumeManifest.model_validate({"apiVersion": "persys.dev/v1", "kind": "Volume",
                                              "metadata": {"name": "c"}, "spec": {"driver": "local", "sizeMb": 8, **s}})
    vols = {"orig": orig, "never": never}
    assert clone_home(manifest(source={"volume": "orig"}), vols) == "n2"
    assert clone_home(manifest(), vols) == ""
    assert source_problems(manifest(source={"volume": "orig"}), vols) == []
    assert source_problems(manifest(source={"volume": "orig"}, node="n1"), vols) == [
        "spec.node: 'n1', but a local clone is made where its source lives ('n2')"]
    assert "holds no data on any node yet" in source_problems(manifest(source={"volume": "never"}), vols)[0]


def test_a_lost_node_is_named_for_fencing_a_ready_one_never() -> None:
    from persys.model import Node, NodeStatus, WorkloadStatus
    from persys.scheduler.rules.volumes import fence_node

    state = Mirror()  # folded by hand: the mirror is data
    state.workloads["db"] = Versioned(workload("db", [{"name": "d", "driver": "ceph-rbd", "mountPath": "/d"}]), 1)
    state.workloads["web"] = Versioned(workload("web", []), 1)
    for inst in ("db", "web"):
        state.statuses[inst] = Versioned(WorkloadStatus(relocating_from="a"), 1)
    state.nodes["a"] = Versioned(Node(id="a", status=NodeStatus.NOT_READY), 1)
    assert fence_node(state, "db") == "a"
    assert fence_node(state, "web") == ""  # no volumes: nothing to fence
    state.nodes["a"] = Versioned(Node(id="a", status=NodeStatus.READY), 2)
    assert fence_node(state, "db") == ""  # alive (a drain): it detaches by itself
    del state.nodes["a"]
    assert fence_node(state, "db") == "a"  # deleted node
    state.statuses["db"] = Versioned(WorkloadStatus(), 3)
    assert fence_node(state, "db") == ""


def test_reclaim_delete_is_refused_on_a_standalone_volume() -> None:
    """It did nothing there (nothing removes a standalone Volume but its own deletion)."""
    from persys.scheduler.rules.volumes import standalone_reclaim_problem

    delete = VolumeObjectSpec.model_validate({"driver": "local", "sizeMb": 8, "reclaimPolicy": "Delete"})
    retain = VolumeObjectSpec.model_validate({"driver": "local", "sizeMb": 8})
    assert standalone_reclaim_problem(delete, owner="").startswith("spec.reclaimPolicy: Delete removes a volume")
    assert standalone_reclaim_problem(delete, owner="web") == ""  # an inline volume's record, applied back
    assert standalone_reclaim_problem(retain, owner="") == ""
