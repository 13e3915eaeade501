"""Preemption (Kubernetes' and Nomad's rules as anchors): a Pending request may move instances
of a strictly lower priority off one node when that makes it fit there.

`preemption(cluster, request, config) -> Preemption | None`, pure. Candidate nodes are those
whose only failures are room (cpu, memory, disk); on each, victims are taken among the movable
instances of lower priority, lowest priority first (then the largest share of the shortfall),
and any not needed is put back (highest priority first). Nodes are ranked to minimise
disruption: the highest victim priority, then the number of victims, then the sum of their
priorities, then the node id. The chosen one is verified: `decide` on the snapshot without the
victims places the request there. Equal or higher priority is never preempted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .counterfactual import FIT, _amount, _deficit, _only, _with_nodes
from .engine import DEFAULT_CONFIG, Decision, PlacementConfig, decide
from .reasons import every_reason
from .snapshot import NodeInfo, Snapshot, WorkloadRequest
from .whatif import Cluster, Running

MAX_CANDIDATES = 8  # nodes verified with the engine, best ranked first


@dataclass(frozen=True, slots=True)
class Preemption:
    node_id: str
    victims: tuple[Running, ...]
    decision: Decision  # the request placed on node_id once the victims are gone

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node_id, "victims": [{"instance": v.request.id, "priority": v.request.priority}
                                                  for v in self.victims]}


def choose_victims(node: NodeInfo, request: WorkloadRequest, lower: Sequence[Running]) -> list[Running] | None:
    """The victims on `node` for `request` (None: its lower-priority instances cannot make room)."""
    deficit = _deficit(node, request)
    if not deficit:
        return None

    def share(r: Running) -> float:
        return sum(min(_amount(r.request, k), d) / d for k, d in deficit.items())

    chosen: list[Running] = []
    left = dict(deficit)
    for r in sorted(lower, key=lambda r: (r.request.priority, -share(r), r.request.id)):
        if all(v <= 0 for v in left.values()):
            break
        if share(r) <= 0:
            continue
        chosen.append(r)
        for k in left:
            left[k] -= _amount(r.request, k)
    if any(v > 0 for v in left.values()):
        return None
    for r in sorted(chosen, key=lambda r: (-r.request.priority, share(r), r.request.id)):
        rest = [c for c in chosen if c is not r]
        if all(sum(_amount(c.request, k) for c in rest) >= d for k, d in deficit.items()):
            chosen = rest
    return sorted(chosen, key=lambda r: r.request.id)


def _freed(node: NodeInfo, gone: Sequence[Running]) -> NodeInfo:
    services = dict(node.service_counts)
    for r in gone:
        left = services.get(r.request.group, 0) - 1
        if left > 0:
            services[r.request.group] = left
        else:
            services.pop(r.request.group, None)
    return dataclasses.replace(
        node,
        committed_cpu=node.committed_cpu - sum(r.request.cpu_millicores for r in gone),
        committed_memory_mb=node.committed_memory_mb - sum(r.request.memory_mb for r in gone),
        committed_disk_mb=node.committed_disk_mb - sum(r.request.disk_mb for r in gone),
        workload_count=max(0, node.workload_count - len(gone)),
        service_counts=services,
    )


def preemption(cluster: Cluster, request: WorkloadRequest, config: PlacementConfig = DEFAULT_CONFIG
               ) -> Preemption | None:
    config = dataclasses.replace(config, percentage_of_nodes_to_score=100)
    base = Snapshot(tuple(cluster.snapshot.effective))  # its own memo: the caller's is never touched
    if decide(base, request, config).placed:
        return None  # it fits without preempting anyone
    candidates = []
    for node_id, statuses in every_reason(base, request, config.filters, base.ids).items():
        if not _only(statuses, FIT):
            continue
        node = base.node(node_id)
        assert node is not None
        lower = [r for r in cluster.on_node(node_id) if r.request.priority < request.priority and not r.stays]
        chosen = choose_victims(node, request, lower) if lower else None
        if chosen:
            prios = [v.request.priority for v in chosen]
            candidates.append((max(prios), len(chosen), sum(prios), node_id, node, chosen))
    for _, _, _, node_id, node, chosen in sorted(candidates, key=lambda c: c[:4])[:MAX_CANDIDATES]:
        d = decide(_with_nodes(base, [_freed(node, chosen)]), request, config)
        if d.node_id == node_id:
            return Preemption(node_id, tuple(chosen), d)
    return None
