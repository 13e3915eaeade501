"""Property: any manifest (and node) the model accepts never raises in the adapter or the engine.

Manifests and nodes are drawn as raw documents, hostile values included (words and huge numbers
where integers belong, other scripts' digits, empty keys, negative and enormous quantities),
validated by the model as the API and the mirror do; whatever it accepts goes through the real
adapter (to_request, the base snapshot, the reservation ledger) and every engine entry point.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from persys.model import Assignment, DesiredState, ManifestError, Node, Workload
from persys.model.manifest import validate_manifest
from persys.scheduler import placement as pl
from persys.scheduler.decide.mirror import Mirror, Versioned
from persys.scheduler.placing.engine_adapter import PlacementService, to_request

pytestmark = pytest.mark.slow  # pure, but a minute of examples: the full suite runs it, the fast lane not

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = ["zone", "cores", "gpu", "", "persys.dev/service", "ключ", "k" * 300]
WORDS = ["a", "z0", "16", "-3", "+7", "0", "1_000", " 12", "\u0661\u0662", "\uff11\uff12", "12\n", "", "x" * 300,
         "9" * 19, "9" * 5000, "1e3", "nan", "-", "0x10"]
ANY_SCALAR = st.one_of(
    st.sampled_from(WORDS), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.booleans(), st.none(),
    st.text(max_size=8),
)
QUANTITY = st.sampled_from([-1, 2**40, 2**40 + 1, 2**63, 10**400, -(2**63), "100", 1.5, True, None])
# A node's three capacities are drawn together: hostile less often, so most nodes pass.
NODE_QUANTITY = st.integers(0, 15).flatmap(lambda k: QUANTITY if k == 0 else st.integers(0, 8000))
GOOD_WORDS = ["a", "z0", "16", "-3", "+7", "0"]


# Lists of strings that a lax model takes but a literal reading of the operator cannot: no
# value, two for a comparison, words, digits int() would read differently or not at all.
ODD_VALUES = st.sampled_from([[], ["lots"], ["1", "2"], ["1_000"], ["\u0661\u0662"], ["9" * 5000], [" 7"], ["a"]])
GOOD_OPS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]


class Picker:
    """Draws plausible values, except in a hostile document, where exactly one of its values is
    hostile: enough documents pass the model for the engine to be exercised, and each hostile one
    tests one edge of the model (several at once would mostly be refused for the easiest)."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw
        self.target = draw(st.integers(0, 12)) if draw(st.booleans()) else -1
        self.calls = 0

    def __call__(self, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
        self.calls += 1
        return self.draw(bad if self.calls - 1 == self.target else good)


def constraint_doc(draw: Any, pick: Picker) -> dict[str, Any]:
    op = pick(st.sampled_from(GOOD_OPS), st.sampled_from(["Matches", "", "gt"]))
    doc: dict[str, Any] = {"key": pick(st.sampled_from(KEYS[:5]), st.sampled_from(KEYS)), "operator": op}
    if op in ("Gt", "Lt"):
        good: st.SearchStrategy[Any] = st.sampled_from(["16", "-3", "+7", "0", "999999999999999999"]).map(
            lambda v: [v])
    elif op in ("In", "NotIn"):
        good = st.lists(st.sampled_from(GOOD_WORDS), min_size=1, max_size=3)
    else:
        good = st.just([])
    doc["values"] = pick(good, st.one_of(ODD_VALUES, st.lists(st.sampled_from(WORDS), max_size=3),
                                         st.lists(ANY_SCALAR, max_size=2), ANY_SCALAR))
    return doc


def toleration_doc(draw: Any, pick: Picker) -> dict[str, Any]:
    op = pick(st.sampled_from(["Equal", "Exists"]), ANY_SCALAR)
    key = pick(st.sampled_from(["gpu", "maint", "spot"] + ([""] if op == "Exists" else [])), ANY_SCALAR)
    doc: dict[str, Any] = {"key": key, "operator": op}
    if op != "Exists":
        doc["value"] = pick(st.sampled_from(["", "true", "x"]), ANY_SCALAR)
    doc["effect"] = pick(st.sampled_from(["", "NoSchedule", "PreferNoSchedule", "NoExecute"]),
                         st.one_of(st.just("Always"), ANY_SCALAR))
    return doc


@st.composite
def manifest_doc(draw: Any, name: str) -> dict[str, Any]:
    pick = Picker(draw)
    spec: dict[str, Any] = {"type": draw(st.sampled_from(["process", "container"]))}
    spec[spec["type"]] = {"command": ["sleep", "1"]} if spec["type"] == "process" else {"image": "img"}
    quantity = st.integers(0, 5000)
    if draw(st.booleans()):
        spec["resources"] = {k: pick(quantity, QUANTITY) for k in ("cpuMillicores", "memoryMb", "diskMb")
                             if draw(st.booleans())}
    if draw(st.booleans()):
        spec["replicas"] = pick(st.integers(1, 4), st.sampled_from([0, -1, 10_001, 2**64, "2"]))
    if draw(st.booleans()):
        spec["constraints"] = [constraint_doc(draw, pick) for _ in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):
        spec["nodeSelector"] = {pick(st.sampled_from(KEYS[:5]), st.sampled_from(KEYS)):
                                pick(st.sampled_from(WORDS), ANY_SCALAR) for _ in range(draw(st.integers(1, 2)))}
    if draw(st.booleans()):
        spec["tolerations"] = [toleration_doc(draw, pick) for _ in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):
        spec["avoidNodes"] = draw(st.lists(st.sampled_from(["n0", "n1", "", "nope"]), max_size=2))
    if draw(st.booleans()):
        spec["requiredFeatures"] = pick(st.lists(st.sampled_from(["process:x", "vm:kvm"]), max_size=2),
                                        st.lists(st.sampled_from(["kvm", ""]), min_size=1, max_size=2))
    if draw(st.booleans()):
        spec["spreadBy"] = pick(st.sampled_from(KEYS[:5]), st.sampled_from(KEYS))
    if draw(st.booleans()):
        spec["volumes"] = [{"name": "d", "mountPath": "/d", "driver": pick(st.sampled_from(["local", "nfs"]),
                                                                           st.just("zfs")),
                            "sizeMb": pick(quantity, QUANTITY)}]
    labels = {"persys.dev/service": draw(st.sampled_from(["web", ""]))} if draw(st.booleans()) else {}
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name, "labels": labels},
            "spec": spec}


@st.composite
def node_doc(draw: Any, node_id: str) -> dict[str, Any]:
    return {
        "id": node_id,
        "status": draw(st.sampled_from(["Ready", "NotReady"])),
        "cordoned": draw(st.booleans()),
        "capabilities": {
            "runtimes": {t: {"version": "1", "features": draw(st.lists(st.sampled_from(["x", "kvm"]), max_size=2))}
                         for t in draw(st.lists(st.sampled_from(["process", "container"]), min_size=1, max_size=2))},
            "storageDrivers": draw(st.lists(st.sampled_from(["local", "nfs"]), max_size=2)),
            "cpuMillicores": draw(NODE_QUANTITY), "memoryMb": draw(NODE_QUANTITY), "diskMb": draw(NODE_QUANTITY),
        },
        "labels": draw(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(WORDS), max_size=4)),
        "adminLabels": draw(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(WORDS), max_size=1)),
        "taints": [{"key": draw(st.sampled_from(["gpu", "maint", "spot", ""])),
                    "value": draw(st.sampled_from(["", "true"])),
                    "effect": draw(st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]))}
                   for _ in range(draw(st.integers(0, 2)))],
    }


def accepted_workloads(docs: list[dict[str, Any]]) -> list[Workload]:
    out = []
    for doc in docs:
        try:
            out.append(Workload.from_manifest(validate_manifest(doc), 0.0))
        except ManifestError:
            pass
    return out


def accepted_nodes(docs: list[dict[str, Any]]) -> list[Node]:
    out = []
    for doc in docs:
        try:
            out.append(Node.model_validate(doc))
        except ValidationError:
            pass
    return out


@SETTINGS
@given(manifests=st.lists(st.integers(0, 9).flatmap(lambda i: manifest_doc(f"w{i}")), min_size=2, max_size=6),
       nodes=st.lists(st.integers(0, 5).flatmap(lambda i: node_doc(f"n{i}")), min_size=1, max_size=5),
       committed=st.integers(0, 3))
def test_accepted_manifests_never_raise_in_the_engine(manifests: list[dict[str, Any]], nodes: list[dict[str, Any]],
                                                       committed: int) -> None:
    workloads = {w.id: w for w in accepted_workloads(manifests)}
    event(f"{min(len(workloads), 2)}+ workloads accepted, {min(len(accepted_nodes(nodes)), 2)}+ nodes accepted")
    state = Mirror()  # the mirror is data: no store is read
    for n in accepted_nodes(nodes):
        state.nodes[n.id] = Versioned(n, 1)
    for w in workloads.values():
        state.workloads[w.id] = Versioned(w, 1)
    # Some already committed capacity, from accepted workloads' own requests.
    for (wid, w), node_id in zip(list(workloads.items())[:committed], sorted(state.nodes), strict=False):
        r = w.spec.resources
        a = Assignment(instance_id=wid, node_id=node_id, revision=w.revision, generation=1,
                       desired_state=DesiredState.RUNNING, cpu_millicores=r.cpu_millicores, memory_mb=r.memory_mb,
                       disk_mb=r.disk_mb)
        state.assignments.setdefault(node_id, {})[wid] = Versioned(a, 1)
    service = PlacementService(state)
    requests = [to_request(w, f"{w.id}.{i}" if i else w.id, pinned_node="n0" if i == 2 else None)
                for w in workloads.values() for i in range(min(w.spec.replicas, 3))]
    for decision in service.place(requests):  # the scheduler's path: base snapshot + ledger
        decision.explain()
        decision.to_dict()
    service.plan(requests)
    snap = service.snapshot()
    for r in requests:
        d = pl.decide(snap, r)
        d.explain()
        for node_id in [*state.nodes, "missing"]:
            ev = service.evaluate(r, node_id)
            if ev is not None:
                ev.to_dict()
    pl.place_many(service.base(), requests, pl.Reservations())
