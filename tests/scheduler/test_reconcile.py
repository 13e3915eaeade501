"""Reconciliation plans, table-driven from tests/scheduler/reconcile_cases/*.yaml.

Each case is a mirror (workloads, nodes, assignments, statuses, what agents still run) and the
plan `reconcile.plan` must return for one workload: its writes, each summarised as its guards,
its intents, its events and what follows it, and the instances that need a node. Pure: no
store, no clock, no sleeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.model import Assignment, Capabilities, Node, Workload, WorkloadManifest, WorkloadStatus
from persys.model.workload import workload_of
from persys.scheduler.decide import reconcile
from persys.scheduler.decide.effects import Intent, Write
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.mirror import fold, keys
from persys.store.base import KeyValue
from tests.cases import load

CASE_DIR = Path(__file__).parent / "reconcile_cases"
CASES = [c for f in sorted(CASE_DIR.glob("*.yaml")) for c in load(f)]
NOW = 5000.0


def workload(name: str, doc: dict[str, Any]) -> Workload:
    spec: dict[str, Any] = {"type": "process", "process": {"command": ["sleep", "60"]},
                            "replicas": doc.get("replicas", 1), "desiredState": doc.get("desired", "Running"),
                            "resources": {"cpuMillicores": 100, "memoryMb": 64}}
    if doc.get("local_volume"):
        spec["volumes"] = [{"name": "data", "mountPath": "/data"}]
    if doc.get("on_disconnect"):
        spec["onDisconnect"] = doc["on_disconnect"]
    m = WorkloadManifest.model_validate({"apiVersion": "persys.dev/v1", "kind": "Workload",
                                         "metadata": {"name": name}, "spec": spec})
    return Workload.from_manifest(m, 1000.0).model_copy(update={"deleting": doc.get("deleting", False)})


def mirror(case: dict[str, Any]) -> Mirror:
    """The case's mirror, filled by the fold of a snapshot (the way a replica loads it): no store."""
    kvs: list[KeyValue] = []
    rev = 0

    def put(key: str, value: bytes) -> None:
        nonlocal rev
        rev += 1
        kvs.append(KeyValue(key, value, rev, rev, 1))

    workloads = {n: workload(n, d or {}) for n, d in (case.get("workloads") or {}).items()}
    for n, w in workloads.items():
        put(keys.workload(n), w.to_json())
    for n, raw in (case.get("refused") or {}).items():
        put(keys.workload(n), raw.encode())
    for n, d in (case.get("nodes") or {}).items():
        d = d or {}
        node = Node(id=n, capabilities=Capabilities(), status=d.get("status", "Ready"),
                    status_reason=d.get("reason", ""), draining=d.get("draining", False),
                    last_heartbeat=float(d.get("last_heartbeat", 0.0)))
        put(keys.node(n), node.to_json())
    for inst, d in (case.get("assigned") or {}).items():
        d = d if isinstance(d, dict) else {"node": d}
        w = workloads.get(workload_of(inst))  # None: a workload that is gone, or refused
        a = Assignment(instance_id=inst, node_id=d["node"], revision=d.get("revision", w.revision if w else "r1"),
                       generation=w.generation if w else 1,
                       desired_state=d.get("desired", w.spec.desired_state if w else "Running"), created_at=0.0)
        put(keys.assignment(d["node"], inst), a.to_json())
    for inst, d in (case.get("statuses") or {}).items():
        st = WorkloadStatus(phase=d.get("phase", "Running"), node_id=d.get("node", ""), reason=d.get("reason", ""),
                            message=d.get("message", ""), relocating_from=d.get("relocating_from", ""),
                            volume_node=d.get("volume_node", ""))
        put(keys.status(inst), st.to_json())
    for n, generations in (case.get("revisions") or {}).items():  # the mirror indexes their keys only
        for g in generations:
            put(keys.revision(n, g), b"{}")
    state = Mirror()
    fold.fold_snapshot(state, kvs, rev)
    return state


def intent_text(i: Intent) -> str:
    """An intent as the cases write it: `delete assignment n1/web`, `put status web Pending/Relocating`."""
    if i.doc is None:
        return f"delete {i.kind} {i.ident}"
    if isinstance(i.doc, WorkloadStatus):
        return f"put status {i.ident} {i.doc.phase}/{i.doc.reason}"
    if isinstance(i.doc, Assignment):
        return f"put assignment {i.ident} {i.doc.desired_state}"
    return f"put {i.kind} {i.ident}"


def summary(w: Write) -> dict[str, Any]:
    out: dict[str, Any] = {"guard": [f"{g.kind} {g.ident}" for g in w.guards],
                           "ops": [intent_text(i) for i in w.intents]}
    if w.events:
        out["events"] = [e.kind for e in w.events]
    if w.then:
        out["then"] = [summary(t) for t in w.then]
    if w.otherwise is not None:
        out["otherwise"] = summary(w.otherwise)
    if w.requeue:
        out["requeue"] = w.requeue
    if w.forget_usage:
        out["forget_usage"] = w.forget_usage
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_reconcile_case(case: dict[str, Any]) -> None:
    state = mirror(case)
    running = {tuple(s.split("@")) for s in case.get("runs_on", [])}
    plan = reconcile.plan(state, case["reconcile"], set(case.get("inflight", [])),
                          lambda inst, node: (inst, node) in running, NOW, float(case.get("stop_delay", 0.0)))
    want = case["expect"]
    assert [summary(w) for w in plan.writes] == want.get("writes", [])
    assert [n.instance for n in plan.needs] == want.get("needs", [])
