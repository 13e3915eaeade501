"""The edge between the durable model and the pure placement engine.

It owns the scheduler's reservation ledger and a *base* snapshot of the cluster. Rebuilding
the base costs O(nodes), so it happens only when node facts change, an assignment disappears
or changes, or the ledger has grown large; in between, every placement is a reservation in the
ledger, which the engine overlays on the base. A reservation is taken at decision time and
stays until the next rebuild folds it into committed capacity (by then its assignment is
durable) or until its commit fails. Concurrent placements therefore never see stale capacity,
and nothing is counted twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any

from persys.model import NodeStatus, Workload
from persys.model.volume import Volume
from persys.model.workload import workload_of
from persys.observability.metrics import LoopHistogram
from persys.scheduler import placement as pl
from persys.scheduler.decide.mirror import Mirror, Versioned
from persys.scheduler.decide.volumes import has_local_volumes as has_local_volumes  # re-exported
from persys.scheduler.mirror.follower import ClusterState
from persys.scheduler.placement import record as precord
from persys.scheduler.rules.volumes import volume_ids

SERVICE_LABEL = "persys.dev/service"
LEDGER_REBUILD_THRESHOLD = 4096  # fold landed reservations into the base beyond this


def service_of(w: Workload) -> str:
    """Spread group: the service label, else the workload (so its replicas spread)."""
    return w.labels.get(SERVICE_LABEL, "") or w.id


def volume_needs(w: Workload, volumes: Mapping[str, Versioned[Volume]]) -> frozenset[str]:
    """What the workload's volumes need of a node, as "<driver>:<attach kind>" (a claim's driver
    is its Volume's): VMs take disks, everything else mounted directories."""
    kind = "vm-disk" if w.spec.type in ("vm", "microvm") else "filesystem"
    out = set()
    for v in w.spec.volumes:
        rec = volumes.get(v.claim) if v.claim is not None else None
        out.add(f"{rec.value.spec.driver if rec is not None else v.driver}:{kind}")
    return frozenset(out)


def volume_home(w: Workload, volumes: Mapping[str, Versioned[Volume]]) -> str | None:
    """The node a local volume of the workload already lives on (its data cannot move), if any."""
    for vid in volume_ids(w.id, w.spec):
        rec = volumes.get(vid)
        if rec is not None and rec.value.spec.driver == "local" and rec.value.node:
            return rec.value.node
    return None


def to_request(w: Workload, instance: str, pinned_node: str | None = None,
               volumes: Mapping[str, Versioned[Volume]] | None = None) -> pl.WorkloadRequest:
    spec = w.spec
    vols = volumes or {}
    return pl.WorkloadRequest(
        id=instance,
        type=spec.type,
        cpu_millicores=spec.resources.cpu_millicores,
        memory_mb=spec.resources.memory_mb,
        disk_mb=spec.resources.disk_mb,
        node_selector=dict(spec.node_selector),
        constraints=tuple(pl.LabelConstraint(c.key, c.operator, tuple(c.values)) for c in spec.constraints),
        # A toleration with tolerationSeconds lets an instance stay a while on a NoExecute-tainted
        # node, not arrive there (else it would be placed back after each eviction).
        tolerations=tuple(pl.Toleration(t.key, t.operator, t.value, t.effect) for t in spec.tolerations
                          if t.toleration_seconds is None),
        volume_drivers=volume_needs(w, vols),
        pinned_node=pinned_node or (volume_home(w, vols) if vols else None),
        excluded_nodes=frozenset(spec.avoid_nodes),
        required_features=frozenset(spec.required_features),
        service=service_of(w),
        # Scores prefer the emptier domains of the first spread label (hard ones are filtered too).
        spread_label=spec.spread_by or next((t.label for t in spec.topology_spread or ()), None),
        priority=spec.priority or 0,
        spread_constraints=tuple(pl.SpreadConstraint(t.label, t.max_skew, t.when_unsatisfiable == "DoNotSchedule")
                                 for t in spec.topology_spread or ()),
        devices=tuple(pl.DeviceNeed(d.vendor, d.count, d.min_memory_mib) for d in spec.resources.devices or ()),
    )


class PlacementService:
    def __init__(self, state: Mirror, config: pl.PlacementConfig = pl.DEFAULT_CONFIG) -> None:
        self.state = state
        self.config = config
        self.ledger = pl.Reservations()
        self._fresh: set[str] = set()  # reserved, assignment not yet seen in the mirror
        # The same reservations summed per node (what a decision sees beyond the store: recorded
        # with it for replay, see placement.record), the nodes stored Ready but not heard from,
        # and the record of each instance's latest decision until its status is written.
        self.inflight = precord.InflightTotals()
        self.unheard: set[str] = set()
        self._records: dict[str, tuple[pl.Decision, dict[str, Any]]] = {}
        self.engine = precord.engine_tag(config)
        self._base: pl.Snapshot | None = None
        self._last_base: pl.Snapshot | None = None  # kept while _base awaits a rebuild
        self._current: pl.Snapshot | None = None  # the base seen through the ledger, kept incrementally
        # One NodeInfo per node, recomputed only for nodes that changed: a base rebuild then
        # costs the snapshot's index (about 1 ms at 5,000 nodes), not a pass over every assignment.
        self._infos: dict[str, pl.NodeInfo] = {}
        self._dirty: set[str] = set()
        self._all_dirty = True
        self._changed: dict[str, pl.NodeInfo] = {}  # recomputed since the last base, by id
        self._nodes_changed = False  # a node appeared or vanished since the last base
        # Static-filter verdicts per request shape outlive base rebuilds: a rebuild after
        # placements changes capacity only, and a changed node document (cordon, label,
        # readiness) recomputes that node's verdicts. A new or removed node starts afresh.
        self._static_caches: dict[Any, Any] = {}
        self._static_stale: set[str] = set()
        self.decision_seconds: deque[float] = deque(maxlen=10_000)  # the engine's time per decision, latest
        self.decision_histogram: LoopHistogram | None = None  # the same times, for metrics (set by the replica)
        # Whether a node's agent was heard from since this replica became active (set by the
        # replica; node_monitor.NodeMonitor.heard): a stored Ready alone is no proof of life.
        self.heard: Callable[[str], bool] = lambda node_id: True
        # Load-aware scoring: a node's recent p95 (cpu %, memory MiB), None when not measured;
        # unset: nodes carry no observation (the observed_load scorer is off by default).
        self.observed: Callable[[str], tuple[float, int] | None] | None = None
        if isinstance(state, ClusterState):  # a bare Mirror (a test's, a scenario's) is not followed
            state.subscribe(self._on_change)

    # ------------------------------------------------------------------ base snapshot upkeep

    def _on_change(self, kind: str, ident: str) -> None:
        if kind == "reset":
            self._all_dirty, self._base, self._last_base = True, None, None
            self._static_caches, self._static_stale = {}, set()
        elif kind == "node":
            self._dirty.add(ident)
            self._base = None
            self._static_stale.add(ident)
        elif kind == "assignment":
            node_id, _, instance = ident.partition("/")
            if instance in self._fresh:
                self._fresh.discard(instance)  # our own placement landing: the ledger covers it
                self.inflight.remove(instance)
            else:
                # Removed, changed, or written by someone else: recompute that node.
                self._dirty.add(node_id)
                self._base = None

    def node_heard(self, node_id: str) -> None:
        """A node was heard from for the first time since this replica became active."""
        self._on_change("node", node_id)

    def refresh_nodes(self) -> None:
        """Whether nodes were heard from changed for all of them (this replica became active)."""
        self._on_change("reset", "")

    def observations_changed(self) -> None:
        """Take the nodes' latest observed utilisation into the next snapshot (their static facts
        did not change: the static verdicts stay)."""
        self._dirty.update(self._infos)
        self._base = None

    def reset(self) -> None:
        """Forget every reservation and derived index: the next decision starts from the mirror."""
        for r in list(self.ledger):
            self.ledger.release(r.id)
        self._fresh.clear()
        self.inflight.clear()
        self._records.clear()
        self._on_change("reset", "")

    def release(self, instance: str) -> None:
        """Drop a reservation whose commit failed."""
        if self.ledger.release(instance) is not None:
            self._current = None
        self._fresh.discard(instance)
        self.inflight.remove(instance)
        self._records.pop(instance, None)

    def base(self) -> pl.Snapshot:
        if self._base is None or len(self.ledger) > LEDGER_REBUILD_THRESHOLD:
            self._rebuild()
        assert self._base is not None
        return self._base

    async def prepare(self, chunk: int = 256) -> None:
        """Bring the base snapshot up to date ahead of the next decision, computing changed nodes'
        inputs a chunk at a time with the event loop free in between. After a start, a failover
        or a reset every node is changed: at 5,000 nodes that is tens of milliseconds, which
        the first decision would otherwise pay in one piece."""
        if self._base is not None:
            return
        self._take_all_nodes()
        while len(self._dirty) > chunk:
            for _ in range(chunk):
                self._refresh_info(self._dirty.pop())
            await asyncio.sleep(0)
        self.base()

    def _take_all_nodes(self) -> None:
        if self._all_dirty:
            self._infos, self._changed, self._nodes_changed = {}, {}, True
            self._dirty = set(self.state.nodes)
            self._all_dirty = False

    def _refresh_info(self, node_id: str) -> None:
        info = self._node_info(node_id)
        if info is None:
            self.unheard.discard(node_id)
            if self._infos.pop(node_id, None) is not None:
                self._nodes_changed = True
            self._changed.pop(node_id, None)
            return
        if node_id not in self._infos:
            self._nodes_changed = True
        self._infos[node_id] = self._changed[node_id] = info

    def _rebuild(self) -> None:
        # Reservations whose assignment is now durable become committed capacity of their node.
        for r in list(self.ledger):
            if r.id not in self._fresh:
                self.ledger.release(r.id)
                self._dirty.add(r.node_id)
        self._take_all_nodes()
        for node_id in self._dirty:
            self._refresh_info(node_id)
        self._dirty = set()
        changed, self._changed = list(self._changed.values()), {}
        nodes_changed, self._nodes_changed = self._nodes_changed, False
        if not nodes_changed and self._last_base is not None:
            # Same nodes: replace the changed ones in the previous base (O(changed)).
            self._base = self._last_base.replacing(changed)
        else:
            self._static_caches, self._static_stale = {}, set()  # memoised verdicts are per position
            self._base = pl.Snapshot(tuple(self._infos.values())).sharing_static_caches(self._static_caches)
        self._last_base = self._base
        if self._static_stale:
            pl.refresh_static_verdicts(self._base, self._static_stale)
            self._static_stale = set()
        self._current = None

    def _node_info(self, node_id: str) -> pl.NodeInfo | None:
        cur = self.state.nodes.get(node_id)
        if cur is None:
            return None
        n = cur.value
        workloads = self.state.workloads
        assigned = [a.value for a in self.state.assignments.get(node_id, {}).values()]
        services: Counter[str] = Counter()
        for a in assigned:
            w = workloads.get(workload_of(a.instance_id))
            services[service_of(w.value) if w else workload_of(a.instance_id)] += 1
        caps = n.capabilities
        seen = self.observed(node_id) if self.observed is not None else None
        if n.status == NodeStatus.READY and not self.heard(n.id):
            self.unheard.add(n.id)
        else:
            self.unheard.discard(n.id)
        return pl.NodeInfo(
            id=n.id,
            ready=n.status == NodeStatus.READY and self.heard(n.id),
            schedulable=not n.cordoned,
            runtimes=frozenset(caps.runtimes),
            runtime_features=frozenset(f"{t}:{f}" for t, info in caps.runtimes.items() for f in info.features),
            storage_drivers=frozenset(caps.storage_drivers),
            storage_missing=dict(caps.storage_missing),
            cpu_millicores=caps.cpu_millicores,
            memory_mb=caps.memory_mb,
            disk_mb=caps.disk_mb,
            labels=n.effective_labels(),
            taints=tuple(pl.Taint(t.key, t.value, t.effect) for t in n.effective_taints()),
            committed_cpu=sum(a.cpu_millicores for a in assigned),
            committed_memory_mb=sum(a.memory_mb for a in assigned),
            committed_disk_mb=sum(a.disk_mb for a in assigned),
            workload_count=len(assigned),
            service_counts=dict(services),
            observed_cpu_percent=seen[0] if seen else None,
            observed_memory_mb=seen[1] if seen else None,
            devices=tuple(pl.DeviceSlot(d.id, d.vendor, d.memory_mb) for d in caps.devices),
            devices_used=frozenset(d for a in assigned for d in a.devices or ()) if caps.devices else frozenset(),
        )

    def snapshot(self) -> pl.Snapshot:
        """The cluster as the next decision sees it: base plus in-flight reservations."""
        base = self.base()
        if self._current is None:
            self._current = base.with_reservations(self.ledger.view())
        return self._current

    # ------------------------------------------------------------------ decisions

    def place(self, requests: list[pl.WorkloadRequest]) -> list[pl.Decision]:
        """Decide a batch in order, reserving capacity for each placed request."""
        current = self.snapshot()
        batch = pl.PlacementBatch(current, self.ledger, self.config)
        decisions = []
        for request in requests:
            started = time.perf_counter()  # the engine takes no clock: the caller measures it
            decision = batch.place(request)
            elapsed = time.perf_counter() - started
            decisions.append(decision)
            self.decision_seconds.append(elapsed)
            if self.decision_histogram is not None:
                self.decision_histogram.observe(elapsed)
            self._record(decision, request, current)
        self._current = batch.snapshot()
        return decisions

    def _record(self, decision: pl.Decision, request: pl.WorkloadRequest, current: pl.Snapshot) -> None:
        """Keep what the decision saw beyond the store (before its own reservation joins it)."""
        observed = current.node if self.config.weight("observed_load") > 0 else None
        self._records[request.id] = (decision, precord.seen(decision, request, self.state.revision, self.engine,
                                                            self.inflight, self.unheard, observed))
        if decision.node_id is not None:
            self._fresh.add(request.id)
            reservation = self.ledger.get(request.id)
            if reservation is not None:
                self.inflight.add(reservation)

    def record_of(self, instance: str, decision: pl.Decision) -> dict[str, Any] | None:
        """The record of `decision` for its status (taken: each is written once); None when the
        instance's latest decision is another one (a preemption decides on its own snapshot)."""
        kept = self._records.pop(instance, None)
        return kept[1] if kept is not None and kept[0] is decision else None

    def decision_latency(self) -> dict[str, float | int]:
        """Percentiles of the engine's time per decision over the latest 10,000 decisions."""
        times = sorted(self.decision_seconds)
        if not times:
            return {"decisions": 0}

        def pct(p: float) -> float:
            return round(times[min(len(times) - 1, int(p * len(times)))] * 1000, 3)

        return {"decisions": len(times), "p50Ms": pct(0.5), "p99Ms": pct(0.99), "maxMs": round(times[-1] * 1000, 3)}

    def plan(self, requests: list[pl.WorkloadRequest]) -> list[pl.Decision]:
        """Like `place` but on a scratch copy of the ledger: nothing is reserved. An instance
        planned again while its own placement is in flight is planned afresh (its reservation
        left out of the scratch ledger, where it would collide with the new one)."""
        scratch = pl.Reservations()
        planned = {r.id for r in requests}
        for r in self.ledger:
            if r.id not in planned:
                scratch.reserve(r)
        return pl.place_many(self.base(), requests, scratch, self.config)

    def reserve_decided(self, request: pl.WorkloadRequest, node_id: str, devices: tuple[str, ...] = ()) -> None:
        """Reserve a placement decided outside `place` (a preemption), as `place` reserves."""
        reservation = pl.Reservation(request.id, node_id, request.cpu_millicores, request.memory_mb,
                                     request.disk_mb, request.group, devices)
        self.ledger.reserve(reservation)
        self.inflight.add(reservation)
        self._fresh.add(request.id)
        self._current = None

    def evaluate(self, request: pl.WorkloadRequest, node_id: str) -> pl.NodeEvaluation | None:
        return pl.evaluate_node(self.snapshot(), request, node_id, self.config)
