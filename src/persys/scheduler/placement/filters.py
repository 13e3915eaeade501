"""Default filters, in evaluation order. The first filter that rejects a node is its reason."""

from __future__ import annotations

from collections.abc import Callable

from .devices import DeviceFit
from .framework import Filter, PlacementContext
from .nodebits import NodeBits
from .snapshot import LabelConstraint, NodeInfo, SpreadConstraint, WorkloadRequest
from .status import Status
from .storage_offers import offered, refusal


class NodeReady(Filter):
    name = "node_ready"
    static = True
    _status = Status("node_not_ready", "node not ready", name)

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return True

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        return None if node.ready else self._status


class NodeSchedulable(Filter):
    name = "node_schedulable"
    static = True
    _status = Status("node_unschedulable", "node cordoned or draining", name)

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return True

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        return None if node.schedulable else self._status


class NodeAffinity(Filter):
    """Pinned node (an existing node-local volume lives there) and placement exclusions."""

    name = "node_affinity"
    static = False

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return request.pinned_node is not None or bool(request.excluded_nodes)

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        if request.pinned_node is not None and node.id != request.pinned_node:
            return Status("volume_node_conflict", f"node-local volume is on {request.pinned_node}", self.name)
        if node.id in request.excluded_nodes:
            return Status("excluded", "excluded by placement policy", self.name)
        return None


class TaintToleration(Filter):
    """NoSchedule/NoExecute taints must be tolerated; PreferNoSchedule only costs score."""

    name = "taint_toleration"
    static = True  # taints are static node facts; the verdict depends on the tolerations only

    def static_key(self, request: WorkloadRequest) -> object:
        return request.tolerations

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return ctx.snapshot.static.has_hard_taints

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        if not node.taints:
            return None
        for taint in sorted(node.taints, key=str):  # sorted: the reported taint must not depend on order
            if taint.effect == "PreferNoSchedule":
                continue
            if not any(t.tolerates(taint) for t in request.tolerations):
                return Status("untolerated_taint", f"untolerated taint {taint}", self.name)
        return None


class RuntimeSupported(Filter):
    name = "runtime"
    static = True

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return True

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        if request.type in node.runtimes:
            return None
        return Status("runtime_unsupported", f"no {request.type} runtime", self.name)


class RuntimeFeatures(Filter):
    name = "runtime_features"
    static = False

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return bool(request.required_features)

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        missing = request.required_features - node.runtime_features
        if not missing:
            return None
        return Status(
            "missing_runtime_feature", f"missing runtime feature {','.join(sorted(missing))}", self.name
        )


class StorageDrivers(Filter):
    name = "storage_drivers"
    static = False

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return bool(request.volume_drivers)

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        missing = {n if ":" in n else f"{n}:filesystem" for n in request.volume_drivers} - offered(node.storage_drivers)
        if not missing:
            return None
        return Status("storage_driver_missing", refusal(missing, node.storage_drivers, node.storage_missing),
                      self.name)


class NodeSelector(Filter):
    name = "node_selector"
    static = True  # labels are static node facts; the verdict depends on the selector only

    def static_key(self, request: WorkloadRequest) -> object:
        return tuple(sorted(request.node_selector.items()))

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return bool(request.node_selector)

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        labels = node.labels
        for key in sorted(request.node_selector):
            want = request.node_selector[key]
            if labels.get(key) != want:
                return self._mismatch(key, want)
        return None

    def static_groups(self, request: WorkloadRequest, nodes: NodeBits) -> dict[Status, int]:
        """``check`` for every node at once, from the label index: the first key (sorted) a
        node does not match is its reason."""
        selector = request.node_selector
        return nodes.first_unmet((self._mismatch(key, selector[key]), nodes.label(key).get(selector[key], 0))
                                 for key in sorted(selector))

    def _mismatch(self, key: str, want: str) -> Status:
        return Status("node_selector_mismatch", f"node selector {key}={want} not matched", self.name)


class LabelConstraints(Filter):
    name = "label_constraints"
    static = True  # labels are static node facts; the verdict depends on the constraints only

    def static_key(self, request: WorkloadRequest) -> object:
        return request.constraints

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return bool(request.constraints)

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        for c in request.constraints:
            if not c.matches(node.labels):
                return self._unsatisfied(c)
        return None

    def static_groups(self, request: WorkloadRequest, nodes: NodeBits) -> dict[Status, int]:
        """``check`` for every node at once: each constraint is asked once per distinct value of
        its key (``matches`` itself decides, so both forms agree), the first unmet one is the
        reason."""
        return nodes.first_unmet((self._unsatisfied(c), nodes.matching(c.key, _accepts(c)))
                                 for c in request.constraints)

    def _unsatisfied(self, c: LabelConstraint) -> Status:
        return Status("label_constraint", f"constraint {c} not satisfied", self.name)


def _accepts(c: LabelConstraint) -> Callable[[str | None], bool]:
    """Whether a node whose value of c.key is `value` (None: no such label) meets c."""
    return lambda value: c.matches({} if value is None else {c.key: value})


class TopologySpread(Filter):
    """Hard topology spread (Kubernetes' maxSkew with DoNotSchedule): placing here must not make
    this node's domain hold more than `max_skew` replicas of the group beyond the emptiest domain.
    Domains are the label's values on the nodes the request's selector and constraints allow
    (a node without the label is refused: it belongs to no domain). Counts include reservations."""

    name = "topology_spread"
    static = False

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return any(c.hard for c in request.spread_constraints)

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        for c in request.spread_constraints:
            if not c.hard:
                continue
            value = node.labels.get(c.label)
            if value is None:
                return Status("topology_spread", f"no {c.label} label (topology spread)", self.name)
            counts = _domain_counts(ctx, request, c)
            skew = counts.get(value, 0) + 1 - min(counts.values(), default=0)
            if skew > c.max_skew:
                return Status("topology_spread",
                              f"topology spread {c.label}={value}: skew {skew} > maxSkew {c.max_skew}", self.name)
        return None


def _domain_counts(ctx: PlacementContext, request: WorkloadRequest, c: SpreadConstraint) -> dict[str, int]:
    """Replicas of the request's group per value of c.label over the eligible nodes, once per
    decision (ctx.scratch)."""
    key = f"topology_spread.{c.label}"
    cached: dict[str, int] | None = ctx.scratch.get(key)
    if cached is not None:
        return cached
    group, selector, constraints = request.group, request.node_selector, request.constraints
    counts: dict[str, int] = {}
    for n in ctx.snapshot.effective:
        value = n.labels.get(c.label)
        if value is None or any(n.labels.get(k) != v for k, v in selector.items()):
            continue
        if constraints and not all(x.matches(n.labels) for x in constraints):
            continue
        counts[value] = counts.get(value, 0) + n.service_counts.get(group, 0)
    ctx.scratch[key] = counts
    return counts


# Fit filters compare requests against committed + reserved requests, never observed usage:
# usage fluctuates, and a decision must be reproducible from the snapshot alone.


class CpuFit(Filter):
    name = "cpu_fit"
    static = False

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return request.cpu_millicores > 0

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        free = node.cpu_millicores - node.committed_cpu
        if request.cpu_millicores <= free:
            return None
        return Status("insufficient_cpu", "insufficient cpu", self.name, request.cpu_millicores, free, "cpu")


class MemoryFit(Filter):
    name = "memory_fit"
    static = False

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return request.memory_mb > 0

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        free = node.memory_mb - node.committed_memory_mb
        if request.memory_mb <= free:
            return None
        return Status("insufficient_memory", "insufficient memory", self.name, request.memory_mb, free, "MiB")


class DiskFit(Filter):
    name = "disk_fit"
    static = False

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return request.disk_mb > 0

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        free = node.disk_mb - node.committed_disk_mb
        if request.disk_mb <= free:
            return None
        return Status("insufficient_disk", "insufficient disk", self.name, request.disk_mb, free, "MiB")


DEFAULT_FILTERS: tuple[Filter, ...] = (
    NodeReady(),
    NodeSchedulable(),
    NodeAffinity(),
    TaintToleration(),
    RuntimeSupported(),
    RuntimeFeatures(),
    StorageDrivers(),
    NodeSelector(),
    LabelConstraints(),
    TopologySpread(),
    CpuFit(),
    MemoryFit(),
    DiskFit(),
    DeviceFit(),
)
