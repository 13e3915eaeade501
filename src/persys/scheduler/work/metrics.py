"""A replica's metrics: the counters its loops bump (reconciliation, placement decisions,
group-commit batches) and, at scrape time, gauges read from what the replica already holds
(the mirror, the queue, leadership, mirror lag, node and workload counts, usage). The
catalogue with every name and help text is `persys.observability.metrics`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Protocol

from persys.events.outbox import EventOutbox
from persys.model import DesiredState, NodeStatus, WorkloadUsage
from persys.observability.metrics import USAGE_SERIES_MAX, Metrics, Sample
from persys.scheduler import placement as pl
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.ha.election import LeaderElection
from persys.scheduler.ha.mode_guard import Mode, ModeGuard
from persys.scheduler.mirror.follower import ClusterState
from persys.scheduler.placement.verdicts import Rejections

MODES = tuple(str(m) for m in Mode)
DELETING = "Deleting"
DESIRED = (*(str(d) for d in DesiredState), DELETING)
NO_NODES = "no_nodes"


def refusal_reason(decision: pl.Decision) -> str:
    """The reason class of a decision that found no node: the code most nodes were rejected
    with (a closed set: the filters' codes), or `no_nodes`."""
    if decision.total == 0 or not decision.rejections:
        return NO_NODES
    rejections = decision.rejections
    counts = rejections.code_counts() if isinstance(rejections, Rejections) \
        else Counter(s.code for s in rejections.values())
    return max(sorted(counts), key=lambda c: counts[c]) if counts else NO_NODES


class ReplicaMetrics:
    """What the replica's components count as it happens (event-loop thread only)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.reconciles = metrics.counter("persys_reconcile_total")
        self.reconcile_seconds = metrics.histogram("persys_reconcile_duration_seconds")
        self.placements = metrics.counter("persys_placements_total")
        self.refusals = metrics.counter("persys_placement_refusals_total")
        self.preemptions = metrics.counter("persys_preemptions_total")
        self.decision_seconds = metrics.histogram("persys_placement_decision_duration_seconds")
        self.batch_sizes = metrics.histogram("persys_group_commit_batch_size")

    def decided(self, decisions: list[pl.Decision]) -> None:
        placed = sum(1 for d in decisions if d.node_id is not None)
        if placed:
            self.placements.inc(("placed",), placed)
        if placed < len(decisions):
            self.placements.inc(("unschedulable",), len(decisions) - placed)
            for d in decisions:
                if d.node_id is None:
                    self.refusals.inc((refusal_reason(d),))


class ReplicaView(Protocol):
    """What the scrape reads of a replica."""

    state: ClusterState
    election: LeaderElection
    guard: ModeGuard
    outbox: EventOutbox
    usage: dict[str, WorkloadUsage]

    @property
    def is_active(self) -> bool: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def commits_in_flight(self) -> int: ...
    @property
    def reservations(self) -> int: ...
    @property
    def sharded(self) -> bool: ...
    def owns(self, node_id: str) -> bool: ...


def replica_samples(r: ReplicaView) -> Iterator[Sample]:
    yield "persys_scheduler_leader", (), float(r.election.is_leader)
    yield "persys_scheduler_active", (), float(r.is_active)
    mode = str(r.guard.mode)
    for m in MODES:
        yield "persys_scheduler_mode", (m,), float(m == mode)
    yield "persys_scheduler_sharded", (), float(r.sharded)
    yield "persys_scheduler_owned_nodes", (), float(sum(1 for n in r.state.nodes if r.owns(n)))
    yield "persys_reconcile_queue_depth", (), float(r.queue_depth)
    yield "persys_placement_reservations", (), float(r.reservations)
    yield "persys_placement_commits_in_flight", (), float(r.commits_in_flight)
    yield "persys_events_outbox_depth", (), float(r.outbox.depth)
    yield "persys_events_dropped_total", (), float(r.outbox.ledger.total)
    state = r.state
    yield "persys_mirror_revision", (), float(state.revision)
    yield "persys_mirror_lag_revisions", (), float(max(0, state.lag.store_revision - state.revision))
    yield "persys_mirror_watch_up", (), float(not state.recovering and not state.watch_error)


def cluster_samples(state: Mirror) -> Iterator[Sample]:
    """Nodes, workloads and capacity as the mirror holds them (every replica's view). One pass
    over each map, with the enum values counted as they are (str() once per label, not per item)."""
    nodes: Counter[tuple[NodeStatus, bool]] = Counter()
    cpu_alloc = mem_alloc = cpu_req = mem_req = 0
    for vn in state.nodes.values():
        n = vn.value
        nodes[(n.status, n.cordoned)] += 1
        if n.status == NodeStatus.READY:
            cpu_alloc += int(n.capabilities.cpu_millicores)
            mem_alloc += int(n.capabilities.memory_mb)
            for va in state.assignments.get(n.id, {}).values():
                cpu_req += va.value.cpu_millicores
                mem_req += va.value.memory_mb
    for status in NodeStatus:
        for cordoned in (False, True):
            yield "persys_nodes", (str(status), "true" if cordoned else "false"), float(nodes[(status, cordoned)])
    phases = Counter(v.value.phase for v in state.statuses.values())
    for phase, count in phases.items():
        yield "persys_workloads", (str(phase),), float(count)
    desired = Counter(DELETING if v.value.deleting else v.value.spec.desired_state for v in state.workloads.values())
    for d in DESIRED:
        yield "persys_workloads_desired", (d,), float(desired[DELETING if d == DELETING else DesiredState(d)])
    yield "persys_cluster_cpu_millicores", ("allocatable",), float(cpu_alloc)
    yield "persys_cluster_cpu_millicores", ("requested",), float(cpu_req)
    yield "persys_cluster_memory_bytes", ("allocatable",), float(mem_alloc << 20)
    yield "persys_cluster_memory_bytes", ("requested",), float(mem_req << 20)


def usage_samples(usage: dict[str, WorkloadUsage], cap: int = USAGE_SERIES_MAX) -> Iterator[Sample]:
    """Per-instance usage as agents reported it: the only per-object series, for at most `cap`
    instances (the first in id order; the rest are counted). Gone with the instance's usage."""
    ids = sorted(usage)
    for inst in ids[:cap]:
        u = usage[inst]
        labels = (inst,)
        yield "persys_workload_cpu_ratio", labels, u.cpu_percent / 100.0
        yield "persys_workload_memory_bytes", labels, float(u.memory_bytes)
        yield "persys_workload_disk_read_bytes_total", labels, float(u.disk_read_bytes)
        yield "persys_workload_disk_write_bytes_total", labels, float(u.disk_write_bytes)
        yield "persys_workload_network_receive_bytes_total", labels, float(u.net_rx_bytes)
        yield "persys_workload_network_transmit_bytes_total", labels, float(u.net_tx_bytes)
    yield "persys_workload_usage_series_dropped", (), float(max(0, len(ids) - cap))


def install(metrics: Metrics, replica: ReplicaView) -> None:
    """Register the replica's scrape-time gauges."""
    metrics.on_scrape(lambda: replica_samples(replica))
    metrics.on_scrape(lambda: cluster_samples(replica.state))
    metrics.on_scrape(lambda: usage_samples(replica.usage))
