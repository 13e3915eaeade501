"""Queueing hints (kube-scheduler's): a node change re-enqueues only the Pending instances it
could help. Each Pending status keeps the codes its decision rejected nodes with
(`placement.codes`); a node change is turned into the codes it could lift (a node that became
ready lifts `node_not_ready`, new labels the selector, constraint and spread codes, more room
the fit codes, ...), and only instances with one of those codes are looked at again. A new or
removed node, or an instance without codes (Relocating, stored before codes were kept), is
always looked at; the monitor's periodic retry still looks at every Pending instance."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from persys.model import Node, NodeStatus, WorkloadStatus

FIT = frozenset({"insufficient_cpu", "insufficient_memory", "insufficient_disk"})
LABELS = frozenset({"node_selector_mismatch", "label_constraint", "topology_spread"})


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What placement reads of a node document."""

    ready: bool
    schedulable: bool
    labels: frozenset[tuple[str, str]]
    taints: frozenset[str]
    runtimes: frozenset[str]
    features: frozenset[str]
    drivers: frozenset[str]
    cpu: int
    memory: int
    disk: int

    @staticmethod
    def of(n: Node) -> NodeFacts:
        caps = n.capabilities
        return NodeFacts(
            ready=n.status == NodeStatus.READY, schedulable=not n.cordoned,
            labels=frozenset(n.effective_labels().items()),
            taints=frozenset(str(t) for t in n.effective_taints() if t.effect != "PreferNoSchedule"),
            runtimes=frozenset(caps.runtimes),
            features=frozenset(f"{t}:{f}" for t, info in caps.runtimes.items() for f in info.features),
            drivers=frozenset(caps.storage_drivers), cpu=caps.cpu_millicores, memory=caps.memory_mb,
            disk=caps.disk_mb)


ALL: frozenset[str] = frozenset({"*"})


def lifted(old: NodeFacts | None, new: NodeFacts | None) -> frozenset[str]:
    """The rejection codes a node change could lift (ALL: a node appeared or went, anything)."""
    if old is None or new is None:
        return ALL
    codes: set[str] = set()
    if new.ready and not old.ready:
        codes.add("node_not_ready")
    if new.schedulable and not old.schedulable:
        codes.add("node_unschedulable")
    if old.taints - new.taints:
        codes.add("untolerated_taint")
    if new.labels != old.labels:
        codes |= LABELS
    if new.runtimes - old.runtimes:
        codes.add("runtime_unsupported")
    if new.features - old.features:
        codes.add("missing_runtime_feature")
    if new.drivers - old.drivers:
        codes.add("storage_driver_missing")
    if new.cpu > old.cpu or new.memory > old.memory or new.disk > old.disk:
        codes |= FIT
    return frozenset(codes)


def could_help(codes: Collection[str] | None, hinted: frozenset[str]) -> bool:
    if codes is None or "*" in hinted:
        return True
    return bool(hinted.intersection(codes))


def status_codes(st: WorkloadStatus | None) -> list[str] | None:
    """The codes a Pending status's decision rejected nodes with (None: unknown, look again)."""
    if st is None or st.reason != "Unschedulable":
        return None
    codes = st.placement.get("codes")
    return codes if isinstance(codes, list) else None


class PendingHints:
    """The node facts last seen, and the codes lifted since the monitor last took them."""

    def __init__(self) -> None:
        self.facts: dict[str, NodeFacts] = {}
        self.hinted: set[str] = set()

    def node_changed(self, node_id: str, node: Node | None) -> None:
        new = NodeFacts.of(node) if node is not None else None
        old = self.facts.pop(node_id, None)
        if new is not None:
            self.facts[node_id] = new
        self.hinted |= lifted(old, new)

    def take(self) -> frozenset[str]:
        hinted, self.hinted = frozenset(self.hinted), set()
        return hinted

    def reset(self) -> None:
        """After a reload of the mirror: every node is new again (everything is looked at)."""
        self.facts.clear()
        self.hinted = set(ALL)


def helped(pending: Iterable[str], statuses: dict[str, WorkloadStatus], hinted: frozenset[str]) -> list[str]:
    """The Pending instances the lifted codes could help (pure)."""
    return [inst for inst in pending if could_help(status_codes(statuses.get(inst)), hinted)]
