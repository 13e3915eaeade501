"""The edge between the durable model and the pure placement engine.

Turns the state mirror into a placement `Snapshot` (rebuilt only when nodes or assignments
changed) and a `Workload` into a `WorkloadRequest`.
"""

from __future__ import annotations

from collections import Counter

from persys.model import NodeStatus, Workload
from persys.scheduler import placement as pl
from persys.scheduler.state import ClusterState

SERVICE_LABEL = "persys.dev/service"


def to_request(w: Workload) -> pl.WorkloadRequest:
    spec = w.spec
    return pl.WorkloadRequest(
        id=w.id,
        type=spec.type,
        cpu_millicores=spec.resources.cpu_millicores,
        memory_mb=spec.resources.memory_mb,
        disk_mb=spec.resources.disk_mb,
        node_selector=dict(spec.node_selector),
        constraints=tuple(pl.LabelConstraint(c.key, c.operator, tuple(c.values)) for c in spec.constraints),
        tolerations=tuple(pl.Toleration(t.key, t.operator, t.value, t.effect) for t in spec.tolerations),
        volume_drivers=frozenset(v.driver for v in spec.volumes),
        service=w.labels.get(SERVICE_LABEL, ""),
    )


class PlacementService:
    def __init__(self, state: ClusterState, config: pl.PlacementConfig = pl.DEFAULT_CONFIG) -> None:
        self.state = state
        self.config = config
        self._snapshot: pl.Snapshot | None = None
        state.subscribe(self._on_change)

    def _on_change(self, kind: str, _ident: str) -> None:
        if kind in ("node", "assignment"):
            self._snapshot = None

    def snapshot(self) -> pl.Snapshot:
        if self._snapshot is None:
            self._snapshot = self._build()
        return self._snapshot

    def _build(self) -> pl.Snapshot:
        nodes = []
        workload_labels = self.state.workloads
        for node_id in sorted(self.state.nodes):
            n = self.state.nodes[node_id].value
            assigned = [a.value for a in self.state.assignments.get(node_id, {}).values()]
            services: Counter[str] = Counter()
            for a in assigned:
                w = workload_labels.get(a.workload_id)
                services[(w.value.labels.get(SERVICE_LABEL, "") if w else "") or a.workload_id] += 1
            caps = n.capabilities
            nodes.append(
                pl.NodeInfo(
                    id=n.id,
                    ready=n.status == NodeStatus.READY,
                    schedulable=not n.cordoned,
                    runtimes=frozenset(caps.runtimes),
                    runtime_features=frozenset(
                        f"{t}:{f}" for t, info in caps.runtimes.items() for f in info.features
                    ),
                    storage_drivers=frozenset(caps.storage_drivers),
                    cpu_millicores=caps.cpu_millicores,
                    memory_mb=caps.memory_mb,
                    disk_mb=caps.disk_mb,
                    labels=dict(n.labels),
                    taints=tuple(pl.Taint(t.key, t.value, t.effect) for t in n.taints),
                    committed_cpu=sum(a.cpu_millicores for a in assigned),
                    committed_memory_mb=sum(a.memory_mb for a in assigned),
                    committed_disk_mb=sum(a.disk_mb for a in assigned),
                    workload_count=len(assigned),
                    service_counts=dict(services),
                )
            )
        return pl.Snapshot(tuple(nodes))

    def decide(self, w: Workload) -> pl.Decision:
        return pl.decide(self.snapshot(), to_request(w), self.config)
