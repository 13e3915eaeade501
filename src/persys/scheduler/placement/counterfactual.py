"""Counterfactuals: the smallest changes that would make a Pending workload fit.

`counterfactuals(cluster, request, config)` looks at every failing filter of every node
(`reasons.every_reason`) and, for nodes whose failures are all of one fixable kind, proposes the
least change that removes them:

* `resources`: a smaller request. For one short resource, the largest amount any such node has
  free ("fits 3 nodes with cpu <= 400m"): one unit more fits no node. For several, the node that
  needs the least relative cut.
* `tolerate`: tolerations for every untolerated hard taint of a node ("n4 if it tolerated
  gpu=true:NoSchedule"); a set that holds another proposed set is dropped (not the smallest).
* `label-node`: label edits on a node that meet the selector and constraints; likewise.
* `uncordon`: a cordoned (or draining) node that fails nothing else.
* `free-node`: the fewest instances whose move off a node frees enough room there (largest first,
  then any one not needed is put back), with where each of them would go (the engine again).

Each proposal is checked by running `decide` on the changed snapshot and request; only those
that then place the workload are kept, with how many nodes it would fit and where it would go.
They are ranked by cost: a resource cut costs its relative size (cutting cpu by 25% costs 0.25,
summed over resources), every other change one per object changed (toleration, label edit,
node uncordoned, instance moved; an instance that would find no other node counts twice); ties
go to the change that fits more nodes. Pure: nothing outside the copies is changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .engine import DEFAULT_CONFIG, Decision, PlacementConfig, decide, place_many
from .reasons import every_reason
from .snapshot import LabelConstraint, NodeInfo, Reservations, Snapshot, Toleration, WorkloadRequest
from .status import Status, fmt_amount
from .whatif import Cluster, Running

FIT = {"insufficient_cpu": "cpu", "insufficient_memory": "memory", "insufficient_disk": "disk"}
UNITS = {"cpu": "cpu", "memory": "MiB", "disk": "MiB"}
FIELDS = {"cpu": "cpu_millicores", "memory": "memory_mb", "disk": "disk_mb"}
LABEL_CODES = {"node_selector_mismatch", "label_constraint"}
MAX_CHANGES = 10
MAX_PER_KIND = 3
MAX_NODES_TO_FREE = 16  # nodes whose instances are weighed for a free-node change


@dataclass(frozen=True, slots=True)
class Change:
    kind: str  # resources | tolerate | label-node | uncordon | free-node
    summary: str
    cost: float
    fits: int = 0  # feasible nodes once changed
    lands_on: str = ""  # where the engine would then place it
    node: str = ""  # the node the change is about ("" for a smaller request)
    resources: Mapping[str, int] = field(default_factory=dict)  # resources: the new request values
    tolerations: tuple[Toleration, ...] = ()  # tolerate: to add
    labels: Mapping[str, str | None] = field(default_factory=dict)  # label-node: set (None: remove)
    moves: tuple[tuple[str, str | None], ...] = ()  # free-node: (instance, where it would go; None: nowhere)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "summary": self.summary, "cost": round(self.cost, 4),
                             "fits": self.fits, "landsOn": self.lands_on}
        if self.node:
            d["node"] = self.node
        if self.resources:
            d["resources"] = {f"{k}{'Millicores' if k == 'cpu' else 'Mb'}": v for k, v in self.resources.items()}
        if self.tolerations:
            d["tolerations"] = [{"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect}
                                for t in self.tolerations]
        if self.labels:
            d["labels"] = dict(self.labels)
        if self.moves:
            d["moves"] = [{"instance": i, "to": to} for i, to in self.moves]
        return d


@dataclass(frozen=True, slots=True)
class Counterfactuals:
    workload_id: str
    decision: Decision  # as things stand
    changes: tuple[Change, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"explanation": self.decision.explain_detailed(), "placedNow": self.decision.node_id,
                "changes": [c.to_dict() for c in self.changes]}


def counterfactuals(cluster: Cluster, request: WorkloadRequest, config: PlacementConfig = DEFAULT_CONFIG,
                    limit: int = MAX_CHANGES) -> Counterfactuals:
    """The smallest verified changes that would place `request`, cheapest first (none when it
    fits already)."""
    config = dataclasses.replace(config, percentage_of_nodes_to_score=100)
    base = Snapshot(tuple(cluster.snapshot.effective))  # its own static memo: changed copies never touch the caller's
    now = decide(base, request, config)
    if now.placed:
        return Counterfactuals(request.id, now, ())
    reasons = every_reason(base, request, config.filters, base.ids)
    found: list[Change] = []
    found += _smaller_request(base, request, config, reasons)
    found += _tolerations(base, request, config, reasons)
    found += _labels(base, request, config, reasons)
    found += _uncordon(base, request, config, reasons)
    found += _free_node(base, cluster, request, config, reasons)
    found.sort(key=lambda c: (c.cost, -c.fits, c.summary))
    return Counterfactuals(request.id, now, tuple(found[:limit]))


def _only(statuses: Sequence[Status], codes: set[str] | Mapping[str, str]) -> bool:
    return bool(statuses) and all(s.code in codes for s in statuses)


def _verify(snapshot: Snapshot, request: WorkloadRequest, config: PlacementConfig) -> Decision | None:
    d = decide(snapshot, request, config)
    return d if d.placed else None


def _with_nodes(snapshot: Snapshot, nodes: Sequence[NodeInfo]) -> Snapshot:
    """The snapshot with some nodes replaced, memoising in a fresh memo (static facts changed)."""
    return snapshot.replacing(nodes).sharing_static_caches({})


# ------------------------------------------------------------------------------- resources


def _free(node: NodeInfo, resource: str) -> int:
    return {"cpu": node.free_cpu, "memory": node.free_memory_mb, "disk": node.free_disk_mb}[resource]


def _smaller_request(snapshot: Snapshot, request: WorkloadRequest, config: PlacementConfig,
                     reasons: Mapping[str, tuple[Status, ...]]) -> list[Change]:
    by_set: dict[frozenset[str], dict[str, int]] = {}
    for node_id, statuses in reasons.items():
        if not _only(statuses, FIT):
            continue
        node = snapshot.node(node_id)
        assert node is not None
        short = frozenset(FIT[s.code] for s in statuses)
        values = {r: _free(node, r) for r in sorted(short)}
        if min(values.values()) <= 0:
            continue  # no room at all: only freeing the node helps (free-node)
        best = by_set.get(short)
        if best is None or _cut(request, values) < _cut(request, best):  # one resource: the most free
            by_set[short] = values
    out = []
    for values in sorted(by_set.values(), key=lambda v: _cut(request, v)):
        changed = dataclasses.replace(request, cpu_millicores=values.get("cpu", request.cpu_millicores),
                                      memory_mb=values.get("memory", request.memory_mb),
                                      disk_mb=values.get("disk", request.disk_mb))
        d = _verify(snapshot, changed, config)
        if d is None:
            continue
        terms = " and ".join(f"{r} <= {fmt_amount(v, UNITS[r])}" for r, v in values.items())
        out.append(Change("resources", f"fits {d.feasible} node(s) with {terms}", _cut(request, values), d.feasible,
                          d.node_id or "", resources=dict(values)))
    return out[:MAX_PER_KIND]


def _cut(request: WorkloadRequest, values: Mapping[str, int]) -> float:
    total = 0.0
    for r, v in values.items():
        asked = _amount(request, r)
        total += (asked - v) / asked if asked else 0.0
    return total


# ------------------------------------------------------------------------------- tolerations


def _untolerated(node: NodeInfo, request: WorkloadRequest) -> tuple[Toleration, ...]:
    need = []
    for taint in sorted(node.taints, key=str):
        if taint.effect == "PreferNoSchedule" or any(t.tolerates(taint) for t in request.tolerations):
            continue
        need.append(Toleration(taint.key, "Equal", taint.value, taint.effect))
    return tuple(need)


def _minimal_sets(candidates: Mapping[frozenset[Any], str]) -> list[tuple[frozenset[Any], str]]:
    """Drop every set that holds another one (it is not the smallest change of its kind)."""
    sets = sorted(candidates.items(), key=lambda kv: (len(kv[0]), kv[1]))
    kept: list[tuple[frozenset[Any], str]] = []
    for s, node_id in sets:
        if not any(k < s for k, _ in kept):
            kept.append((s, node_id))
    return kept


def _tolerations(snapshot: Snapshot, request: WorkloadRequest, config: PlacementConfig,
                 reasons: Mapping[str, tuple[Status, ...]]) -> list[Change]:
    candidates: dict[frozenset[Toleration], str] = {}
    for node_id, statuses in reasons.items():
        if not _only(statuses, {"untolerated_taint"}):
            continue
        node = snapshot.node(node_id)
        assert node is not None
        need = frozenset(_untolerated(node, request))
        if need and need not in candidates:
            candidates[need] = node_id
    out = []
    for need, node_id in _minimal_sets(candidates)[:MAX_PER_KIND]:
        tolerations = tuple(sorted(need, key=lambda t: (t.key, t.value, t.effect)))
        changed = dataclasses.replace(request, tolerations=request.tolerations + tolerations)
        d = _verify(snapshot, changed, config)
        if d is None:
            continue
        text = ", ".join(f"{t.key}={t.value}:{t.effect}" for t in tolerations)
        out.append(Change("tolerate", f"{node_id} if it tolerated {text} (fits {d.feasible} node(s))",
                          float(len(tolerations)), d.feasible, d.node_id or "", node_id, tolerations=tolerations))
    return out


# ------------------------------------------------------------------------------- labels


def _label_edits(node: NodeInfo, request: WorkloadRequest) -> dict[str, str | None] | None:
    """Label changes on `node` that meet the request's selector and constraints (None: they
    contradict each other)."""
    labels: dict[str, str | None] = dict(node.labels)
    edits: dict[str, str | None] = {}
    for key in sorted(request.node_selector):
        if labels.get(key) != request.node_selector[key]:
            edits[key] = labels[key] = request.node_selector[key]
    for c in request.constraints:
        current = {k: v for k, v in labels.items() if v is not None}
        if c.matches(current):
            continue
        value = _meeting(c)
        edits[c.key] = labels[c.key] = value
    final = {k: v for k, v in labels.items() if v is not None}
    if not all(final.get(k) == v for k, v in request.node_selector.items()):
        return None
    if not all(c.matches(final) for c in request.constraints):
        return None
    return edits


def _meeting(c: LabelConstraint) -> str | None:
    """A value of c.key that meets c (None: the label removed)."""
    if c.operator == "In":
        return c.values[0]
    if c.operator == "Exists":
        return "true"
    if c.operator in ("NotIn", "DoesNotExist"):
        return None
    bound = int(c.values[0])
    return str(bound + 1 if c.operator == "Gt" else bound - 1)


def _labels(snapshot: Snapshot, request: WorkloadRequest, config: PlacementConfig,
            reasons: Mapping[str, tuple[Status, ...]]) -> list[Change]:
    candidates: dict[frozenset[tuple[str, str | None]], str] = {}
    for node_id, statuses in reasons.items():
        if not _only(statuses, LABEL_CODES):
            continue
        node = snapshot.node(node_id)
        assert node is not None
        edits = _label_edits(node, request)
        if edits:
            candidates.setdefault(frozenset(edits.items()), node_id)
    out = []
    kept = sorted(candidates.items(), key=lambda kv: (len(kv[0]), kv[1]))  # edits are per node: sets differ
    for edits_set, node_id in kept[:MAX_PER_KIND]:
        edits = dict(sorted(edits_set, key=lambda kv: kv[0]))
        node = snapshot.node(node_id)
        assert node is not None
        labels = {k: v for k, v in {**node.labels, **edits}.items() if v is not None}
        d = _verify(_with_nodes(snapshot, [dataclasses.replace(node, labels=labels)]), request, config)
        if d is None:
            continue
        text = ", ".join(f"{k}={v}" if v is not None else f"{k}-" for k, v in edits.items())
        out.append(Change("label-node", f"label {node_id} {text}", float(len(edits)), d.feasible, d.node_id or "",
                          node_id, labels=edits))
    return out


# ------------------------------------------------------------------------------- uncordon


def _uncordon(snapshot: Snapshot, request: WorkloadRequest, config: PlacementConfig,
              reasons: Mapping[str, tuple[Status, ...]]) -> list[Change]:
    out = []
    for node_id, statuses in reasons.items():
        if not _only(statuses, {"node_unschedulable"}):
            continue
        node = snapshot.node(node_id)
        assert node is not None
        d = _verify(_with_nodes(snapshot, [dataclasses.replace(node, schedulable=True)]), request, config)
        if d is not None:
            out.append(Change("uncordon", f"uncordon {node_id}", 1.0, d.feasible, d.node_id or "", node_id))
        if len(out) >= MAX_PER_KIND:
            break
    return out


# ------------------------------------------------------------------------------- free a node


def _amount(request: WorkloadRequest, resource: str) -> int:
    return {"cpu": request.cpu_millicores, "memory": request.memory_mb, "disk": request.disk_mb}[resource]


def _deficit(node: NodeInfo, request: WorkloadRequest) -> dict[str, int]:
    out = {}
    for r in FIELDS:
        short = _amount(request, r) - _free(node, r)
        if short > 0:
            out[r] = short
    return out


def victims(node: NodeInfo, request: WorkloadRequest, on_node: Sequence[Running]) -> list[Running] | None:
    """The fewest movable instances on `node` whose requests cover its deficit for `request`
    (largest share of the deficit first; then any one not needed is put back), or None."""
    deficit = _deficit(node, request)
    movable = [r for r in on_node if not r.stays]

    def share(r: Running) -> float:
        return sum(min(_amount(r.request, k), d) / d for k, d in deficit.items())

    chosen: list[Running] = []
    left = dict(deficit)
    for r in sorted(movable, key=lambda r: (-share(r), r.request.id)):
        if all(v <= 0 for v in left.values()):
            break
        if share(r) <= 0:
            continue
        chosen.append(r)
        for k in left:
            left[k] -= _amount(r.request, k)
    if any(v > 0 for v in left.values()):
        return None
    for r in sorted(chosen, key=lambda r: (share(r), r.request.id)):  # put back what is not needed
        rest = [c for c in chosen if c is not r]
        if all(sum(_amount(c.request, k) for c in rest) >= d for k, d in deficit.items()):
            chosen = rest
    return sorted(chosen, key=lambda r: r.request.id)


def _free_node(snapshot: Snapshot, cluster: Cluster, request: WorkloadRequest, config: PlacementConfig,
               reasons: Mapping[str, tuple[Status, ...]]) -> list[Change]:
    fit_only = []
    for node_id, statuses in reasons.items():
        if _only(statuses, FIT):
            node = snapshot.node(node_id)
            assert node is not None
            shortfall = _cut(request, {r: max(_free(node, r), 0) for r in _deficit(node, request)})
            fit_only.append((shortfall, node_id, node))
    proposals = []
    # The nodes closest to fitting first, a bounded number: their instances are looked up one
    # node at a time (a caller with many instances builds them only for these).
    for _, node_id, node in sorted(fit_only)[:MAX_NODES_TO_FREE]:
        chosen = victims(node, request, cluster.on_node(node_id))
        if chosen:
            proposals.append((len(chosen), node_id, node, chosen))
    out = []
    for _, node_id, node, chosen in sorted(proposals, key=lambda p: (p[0], p[1]))[:MAX_PER_KIND]:
        freed = dataclasses.replace(
            node,
            committed_cpu=node.committed_cpu - sum(r.request.cpu_millicores for r in chosen),
            committed_memory_mb=node.committed_memory_mb - sum(r.request.memory_mb for r in chosen),
            committed_disk_mb=node.committed_disk_mb - sum(r.request.disk_mb for r in chosen),
            workload_count=max(0, node.workload_count - len(chosen)),
        )
        after = _with_nodes(snapshot, [freed])
        d = _verify(after, request, config)
        if d is None:
            continue
        # Where the moved instances would go: the engine again, once the workload took the room
        # (they may not come back to this node), in order.
        ledger = Reservations()
        first = place_many(after, [request], ledger, config)[0]
        movers = [dataclasses.replace(r.request, excluded_nodes=r.request.excluded_nodes | {node_id})
                  for r in chosen]
        landed = place_many(after, movers, ledger, config) if first.placed else []
        moves = tuple((m.id, dl.node_id) for m, dl in zip(movers, landed, strict=True))
        stranded = sum(1 for _, to in moves if to is None)
        names = ", ".join(f"{i} -> {to or 'nowhere (Pending)'}" for i, to in moves)
        sizes = {k: sum(_amount(r.request, k) for r in chosen) for k in _deficit(node, request)}
        frees = " and ".join(f"{fmt_amount(v, UNITS[k])} {k}" for k, v in sizes.items())
        out.append(Change("free-node", f"moving {names} off {node_id} frees {frees}", float(len(chosen) + stranded),
                          d.feasible, d.node_id or "", node_id, moves=moves))
    return out


def apply_change(cluster: Cluster, request: WorkloadRequest, change: Change) -> tuple[Snapshot, WorkloadRequest]:
    """The snapshot and request once `change` is made (what a caller checks it with; moved
    instances are taken off their node, not placed elsewhere)."""
    base = Snapshot(tuple(cluster.snapshot.effective))
    if change.kind == "resources":
        r = change.resources
        return base, dataclasses.replace(request, cpu_millicores=r.get("cpu", request.cpu_millicores),
                                         memory_mb=r.get("memory", request.memory_mb),
                                         disk_mb=r.get("disk", request.disk_mb))
    if change.kind == "tolerate":
        return base, dataclasses.replace(request, tolerations=request.tolerations + change.tolerations)
    node = base.node(change.node)
    if node is None:
        raise ValueError(f"no node {change.node!r}")
    if change.kind == "label-node":
        labels = {k: v for k, v in {**node.labels, **change.labels}.items() if v is not None}
        return _with_nodes(base, [dataclasses.replace(node, labels=labels)]), request
    if change.kind == "uncordon":
        return _with_nodes(base, [dataclasses.replace(node, schedulable=True)]), request
    if change.kind == "free-node":
        moved = {i for i, _ in change.moves}
        gone = [r.request for r in cluster.on_node(node.id) if r.request.id in moved]
        freed = dataclasses.replace(
            node,
            committed_cpu=node.committed_cpu - sum(g.cpu_millicores for g in gone),
            committed_memory_mb=node.committed_memory_mb - sum(g.memory_mb for g in gone),
            committed_disk_mb=node.committed_disk_mb - sum(g.disk_mb for g in gone),
            workload_count=max(0, node.workload_count - len(gone)))
        return _with_nodes(base, [freed]), request
    raise ValueError(f"unknown change kind {change.kind!r}")
