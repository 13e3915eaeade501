"""What-if questions over the current cluster: operations (`PlanOperation`) and a Pending
workload's counterfactuals (`WhatIfWorkload`). The edge between the mirror and the pure
`placement.whatif` / `placement.counterfactual`: it reads, checks the operator's input (a
ManifestError naming the field: INVALID_ARGUMENT, nothing written) and converts; it writes and
reserves nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, cast

from persys.model import ManifestError
from persys.model.workload import instance_id, workload_of
from persys.scheduler import placement as pl
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.errors import NotFound
from persys.scheduler.placing.engine_adapter import PlacementService, has_local_volumes, to_request

MAX_NODES = 1000  # nodes named (or described) by one operation
MAX_NAME = 253
MAX_LABELS = 64
MAX_TEXT = 253
MAX_QUANTITY = 2**40
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _problem(field: str, message: str) -> ManifestError:
    return ManifestError([f"{field}: {message}"])


def _name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise _problem(field, f"a node name (1-{MAX_NAME} characters) is required")
    return value


def _strings(value: Any, field: str, limit: int = MAX_LABELS) -> list[str]:
    if not isinstance(value, list) or len(value) > limit or not all(isinstance(v, str) and 0 < len(v) <= MAX_TEXT
                                                                     for v in value):
        raise _problem(field, f"a list of at most {limit} non-empty strings is expected")
    return list(value)


def _quantity(item: Mapping[str, Any], key: str, field: str) -> int:
    value = item.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUANTITY:
        raise _problem(f"{field}.{key}", f"an integer from 0 to {MAX_QUANTITY} is expected")
    return value


def _taint(value: Any, field: str) -> pl.Taint:
    if isinstance(value, str):
        head, sep, effect = value.rpartition(":")
        key, _, val = head.partition("=")
        if not sep:
            key, val, effect = value.partition("=")[0], value.partition("=")[2], "NoSchedule"
    elif isinstance(value, dict):
        key, val, effect = value.get("key", ""), value.get("value", ""), value.get("effect", "NoSchedule")
    else:
        raise _problem(field, "a taint is `key=value:Effect` or {key, value, effect}")
    if not isinstance(key, str) or not key or not isinstance(val, str) or effect not in EFFECTS:
        raise _problem(field, f"a taint needs a key and an effect among {', '.join(EFFECTS)}")
    return pl.Taint(key, val, cast("Literal['NoSchedule', 'PreferNoSchedule', 'NoExecute']", effect))


def node_from_doc(item: Any, field: str, like: pl.Snapshot) -> pl.NodeInfo:
    """A node description (the `persys dev --nodes` file's entries, plus `diskMb`, `runtimes`,
    `runtimeFeatures`, `storageDrivers`). Runtimes, features and storage drivers left out are
    those the cluster's ready nodes have (a node like the others)."""
    if not isinstance(item, dict):
        raise _problem(field, "a node description (a mapping with name, cpuMillicores, memoryMb, ...) is expected")
    known = {"name", "labels", "taints", "cpuMillicores", "memoryMb", "diskMb", "runtimes", "runtimeFeatures",
             "storageDrivers"}
    unknown = sorted(set(item) - known)
    if unknown:
        raise _problem(f"{field}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})")
    labels = item.get("labels", {})
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS or not all(
            isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= MAX_TEXT and len(v) <= MAX_TEXT
            for k, v in labels.items()):
        raise _problem(f"{field}.labels", f"a mapping of at most {MAX_LABELS} string labels is expected")
    taints = item.get("taints", [])
    if not isinstance(taints, list) or len(taints) > MAX_LABELS:
        raise _problem(f"{field}.taints", f"a list of at most {MAX_LABELS} taints is expected")
    ready = [n for n in like.effective if n.ready]
    runtimes = item.get("runtimes")
    if isinstance(runtimes, dict):
        runtimes = list(runtimes)
    return pl.NodeInfo(
        id=_name(item.get("name"), f"{field}.name"),
        runtimes=frozenset(_strings(runtimes, f"{field}.runtimes") if runtimes is not None
                           else {r for n in ready for r in n.runtimes}),
        runtime_features=frozenset(_strings(item["runtimeFeatures"], f"{field}.runtimeFeatures")
                                   if "runtimeFeatures" in item else {f for n in ready for f in n.runtime_features}),
        storage_drivers=frozenset(_strings(item["storageDrivers"], f"{field}.storageDrivers")
                                  if "storageDrivers" in item else {d for n in ready for d in n.storage_drivers}),
        cpu_millicores=_quantity(item, "cpuMillicores", field),
        memory_mb=_quantity(item, "memoryMb", field),
        disk_mb=_quantity(item, "diskMb", field) if "diskMb" in item else max((n.disk_mb for n in ready), default=0),
        labels=labels,
        taints=tuple(_taint(t, f"{field}.taints[{i}]") for i, t in enumerate(taints)),
    )


def _label(label: Any) -> tuple[str, str]:
    """`lose-label`'s `key=value`, split."""
    if not isinstance(label, str) or "=" not in label or not label.partition("=")[0] or len(label) > 2 * MAX_TEXT:
        raise _problem("label", "`key=value` is expected")
    key, _, value = label.partition("=")
    return key, value


def operation_from_doc(doc: Any, snapshot: pl.Snapshot) -> pl.Operation:
    """`{"kind": "drain"|"cordon"|"lose-node", "nodes": [...]}`, `{"kind": "lose-label", "label":
    "zone=a"}`, `{"kind": "add-node", "nodes": [{name, cpuMillicores, ...}]}`."""
    if not isinstance(doc, dict):
        raise _problem("operation", "a JSON object with `kind` is expected")
    kind = doc.get("kind")
    if kind not in pl.WHATIF_KINDS:
        raise _problem("kind", f"one of {', '.join(pl.WHATIF_KINDS)} is expected")
    unknown = sorted(set(doc) - {"kind", "nodes", "label"})
    if unknown:
        raise _problem(unknown[0], "unknown field (known: kind, nodes, label)")
    nodes = doc.get("nodes", [])
    if not isinstance(nodes, list) or len(nodes) > MAX_NODES:
        raise _problem("nodes", f"a list of at most {MAX_NODES} nodes is expected")
    if kind == "lose-label":
        return pl.Operation(kind, label=_label(doc.get("label")))
    if not nodes:
        raise _problem("nodes", f"{kind} needs at least one node")
    try:
        if kind == "add-node":
            op = pl.Operation(kind, add=tuple(node_from_doc(n, f"nodes[{i}]", snapshot) for i, n in enumerate(nodes)))
        else:
            op = pl.Operation(kind, nodes=tuple(_name(n, f"nodes[{i}]") for i, n in enumerate(nodes)))
        pl.affected_nodes(snapshot, op)  # an unknown (or, added, an existing) node: say which
        return op
    except ValueError as err:
        if isinstance(err, ManifestError):
            raise
        raise _problem("nodes", str(err)) from None


def cluster_of(state: Mirror, placement: PlacementService) -> pl.Cluster:
    """The mirror as a what-if sees it: the snapshot the next decision would use, the Pending
    instances in order, and each node's assigned instances (with why one could not move: a
    node-local volume lives on its node), built only for the nodes a question asks about (at
    tens of thousands of instances, building them all would hold the event loop)."""
    snapshot = placement.snapshot()
    built: dict[str, tuple[pl.Running, ...]] = {}

    def on_node(node_id: str) -> tuple[pl.Running, ...]:
        if node_id not in built:
            built[node_id] = tuple(_running(state, node_id))
        return built[node_id]

    pending = []
    for inst in sorted(state.pending, key=_order):
        cur = state.workloads.get(workload_of(inst))
        if cur is None or cur.value.deleting or inst in state.placement_of:
            continue
        st = state.statuses.get(inst)
        pending.append(to_request(cur.value, inst, (st.value.volume_node if st else "") or None, state.volumes))
    return pl.Cluster(snapshot, (), tuple(pending), on_node)


def _running(state: Mirror, node_id: str) -> list[pl.Running]:
    out = []
    for inst in sorted(state.assignments.get(node_id, {}), key=_order):
        cur = state.workloads.get(workload_of(inst))
        if cur is None:
            continue
        w = cur.value
        st = state.statuses.get(inst)
        volume_node = st.value.volume_node if st else ""
        stays = ""
        if has_local_volumes(w) and (volume_node or node_id) == node_id:
            stays = f"its node-local volume lives on {node_id}"
        out.append(pl.Running(to_request(w, inst, volume_node or None, state.volumes), node_id, stays))
    return out


async def plan_operation(state: Mirror, placement: PlacementService, doc: Any) -> dict[str, Any]:
    """Read the mirror on the event loop (the snapshot, the affected nodes' instances), then plan
    in a worker thread: losing a zone re-places thousands of instances (seconds at thousands of
    nodes), and the loop keeps serving heartbeats and placements meanwhile. The plan only reads
    copies: the snapshot is immutable and the engine decides on a changed copy of it."""
    cluster = cluster_of(state, placement)
    operation = operation_from_doc(doc, cluster.snapshot)
    affected = pl.affected_nodes(cluster.snapshot, operation)
    ready = dataclasses.replace(cluster, running=tuple(r for n in affected for r in cluster.on_node(n)), lookup=None)

    def plan() -> dict[str, Any]:
        return pl.plan_operation(ready, operation, placement.config).to_dict()

    return await asyncio.to_thread(plan)


def what_if(state: Mirror, placement: PlacementService, wid: str) -> dict[str, Any]:
    """Each replica's counterfactuals (a placed replica has none: it fits)."""
    cur = state.workloads.get(wid)
    if cur is None:
        raise NotFound(f"workload {wid!r}")
    cluster = cluster_of(state, placement)
    replicas = []
    for i in range(cur.value.spec.replicas):
        inst = instance_id(wid, i)
        node_id = state.placement_of.get(inst, "")
        if node_id:
            replicas.append({"instance": inst, "node": node_id, "pending": False, "changes": []})
            continue
        st = state.statuses.get(inst)
        request = to_request(cur.value, inst, (st.value.volume_node if st else "") or None, state.volumes)
        found = pl.counterfactuals(cluster, request, placement.config)
        replicas.append({"instance": inst, "node": "", "pending": True, **found.to_dict()})
    return {"workload": wid, "replicas": replicas}


def _order(instance: str) -> tuple[str, int]:
    head, sep, tail = instance.partition(".")
    return (head, int(tail)) if sep and tail.isdigit() else (instance, 0)
