"""The placement engine: ``decide(snapshot, request, config) -> Decision``. Pure: no I/O, no clocks."""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from types import MappingProxyType
from typing import Any

from .devices import pick as pick_devices
from .filters import DEFAULT_FILTERS
from .framework import Filter, PlacementContext, Scorer
from .nodebits import LabelBits, range_bits
from .reasons import describe_node, every_reason
from .scorers import DEFAULT_SCORERS, DEFAULT_WEIGHTS
from .snapshot import (
    NodeInfo,
    Reservation,
    Reservations,
    ReservationView,
    Snapshot,
    WorkloadRequest,
    apply_reserved,
    stable_hash,
)
from .status import Status
from .verdicts import FilterVerdicts, Rejections, ShapeVerdicts, summarise


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType(dict(DEFAULT_WEIGHTS)))
    filters: tuple[Filter, ...] = DEFAULT_FILTERS
    scorers: tuple[Scorer, ...] = DEFAULT_SCORERS
    top_candidates: int = 3  # how many scored candidates a Decision keeps for its explanation
    # Like kube-scheduler's percentageOfNodesToScore: stop filtering once this share of the
    # cluster is feasible. None = adaptive (50% - nodes/125, at least 5%, at least 100 nodes);
    # 100 = always evaluate every node. Pending decisions always evaluate every node.
    percentage_of_nodes_to_score: int | None = None
    # A pending decision lists every failing filter (not only the first) of up to this many
    # rejected nodes, at most `detail_per_reason` per distinct first reason (0: none). Bounded:
    # at thousands of nodes a full list would cost a pass of every filter over every node.
    detail_nodes: int = 32
    detail_per_reason: int = 8

    def __post_init__(self) -> None:
        names = {s.name for s in self.scorers}
        unknown = set(self.weights) - names
        if unknown:
            raise ValueError(f"weights for unknown scorers: {sorted(unknown)}")
        if any(w < 0 for w in self.weights.values()):
            raise ValueError("scorer weights must be >= 0")
        if self.top_candidates < 1:
            raise ValueError("top_candidates must be >= 1")
        if self.detail_nodes < 0 or self.detail_per_reason < 1:
            raise ValueError("detail_nodes must be >= 0 and detail_per_reason >= 1")
        pct = self.percentage_of_nodes_to_score
        if pct is not None and not 0 < pct <= 100:
            raise ValueError("percentage_of_nodes_to_score must be in (0, 100]")
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        object.__setattr__(self, "filters", tuple(self.filters))
        object.__setattr__(self, "scorers", tuple(self.scorers))

    def weight(self, scorer: str) -> float:
        # A scorer left out of ``weights`` is disabled rather than silently weighted 1.
        return self.weights.get(scorer, 0.0)


DEFAULT_CONFIG = PlacementConfig()


@dataclass(frozen=True, slots=True)
class NodeScore:
    node_id: str
    total: float  # weighted mean of scorer scores, in [0, 100]
    breakdown: Mapping[str, float]  # each scorer's weighted contribution; they sum to ``total``

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "total": round(self.total, 3),
            "breakdown": {k: round(v, 3) for k, v in self.breakdown.items()},
        }


@dataclass(frozen=True, slots=True)
class Decision:
    workload_id: str
    node_id: str | None
    scores: list[NodeScore]
    rejections: Mapping[str, Status]  # node id -> why it was rejected (see verdicts.Rejections)
    feasible: int  # feasible among the evaluated nodes
    total: int
    evaluated: int  # == total unless sampling stopped early (see percentage_of_nodes_to_score)
    # Pending decisions: every failing filter of a bounded sample of the rejected nodes (see
    # PlacementConfig.detail_nodes), node id -> statuses in filter order.
    reasons: Mapping[str, tuple[Status, ...]] = field(default_factory=lambda: _NO_REASONS)
    devices: tuple[str, ...] = ()  # the chosen node's devices the placement is given (GPUs)
    # The feasible nodes found (positions in `order`, the nodes as decided on, by id): with the
    # nodes the dynamic filters rejected, those whose reservations the decision saw (a replay
    # needs those, nothing more). References, no copy: ids are made only when asked for.
    feasible_positions: Sequence[int] = field(default=(), compare=False, repr=False)
    order: Sequence[NodeInfo] = field(default=(), compare=False, repr=False)

    @property
    def feasible_nodes(self) -> tuple[str, ...]:
        order = self.order
        return tuple(order[i].id for i in self.feasible_positions)

    @property
    def placed(self) -> bool:
        return self.node_id is not None

    def explain_nodes(self) -> str:
        """Every reason per detailed node: `n1: insufficient cpu (...); insufficient memory (...) |
        n2: ...`, and how many rejected nodes are not detailed ("" when none are)."""
        if not self.reasons:
            return ""
        text = " | ".join(f"{node_id}: {describe_node(statuses)}" for node_id, statuses in self.reasons.items())
        rest = len(self.rejections) - len(self.reasons)
        return f"{text} | (+{rest} more nodes: explain --node N)" if rest > 0 else text

    def explain_detailed(self) -> str:
        """The aggregated line, then every reason of each detailed node (a pending status says this)."""
        nodes = self.explain_nodes()
        return f"{self.explain()}. Per node: {nodes}" if nodes else self.explain()

    def explain(self) -> str:
        rejections = self.rejections
        rejected = (rejections.summary() if isinstance(rejections, Rejections)
                    else aggregate_rejections(rejections.values()))
        if self.node_id is None:
            if self.total == 0:
                return "0/0 nodes available: no nodes in snapshot"
            return f"0/{self.total} nodes available: {rejected}"
        tops = ", ".join(
            f"{s.node_id}={s.total:.1f} [" + ", ".join(f"{k} {v:.1f}" for k, v in s.breakdown.items()) + "]"
            for s in self.scores
        )
        sampled = f", {self.evaluated} evaluated" if self.evaluated < self.total else ""
        text = f"placed on {self.node_id} ({self.feasible}/{self.total} nodes feasible{sampled})"
        text += f": top candidates {tops}"
        return f"{text}; rejected: {rejected}" if rejected else text

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload_id": self.workload_id,
            "node_id": self.node_id,
            "feasible": self.feasible,
            "total": self.total,
            "evaluated": self.evaluated,
            "scores": [s.to_dict() for s in self.scores],
            "rejections": {k: v.to_dict() for k, v in sorted(self.rejections.items())},
            "reasons": {k: [s.to_dict() for s in v] for k, v in self.reasons.items()},
            "explanation": self.explain(),
        }


_NO_REASONS: Mapping[str, tuple[Status, ...]] = MappingProxyType({})


def aggregate_rejections(statuses: Iterable[Status]) -> str:
    """Kubernetes-style summary: ``30 insufficient memory (needs ..., best node has ... free), 12 ...``.

    Grouped by (code, reason) so different taints stay separate lines; sorted by count desc then text.
    """
    return summarise((status, 1) for status in statuses)


def _filter_key(f: Filter, request: WorkloadRequest) -> object:
    # A static filter's verdict depends on the node's static facts and on the part of the request
    # named by its `static_key` (default: the workload type).
    return f.static_key(request)


def _shape_verdicts(snapshot: Snapshot, static: tuple[Filter, ...], request: WorkloadRequest) -> ShapeVerdicts:
    """The combined static verdicts of this request's shape, memoised on the snapshot's shared
    static index: each static filter's verdict once per node set and static key (shapes that
    differ only in their selector share the readiness, runtime and taint passes), and their
    combination once per shape."""
    cache = snapshot.static.caches
    keys = tuple(_filter_key(f, request) for f in static)
    shape_key = ("shape", tuple(id(f) for f in static), keys)
    hit = cache.get(shape_key)
    if hit is None:
        order = snapshot.static.order
        ctx = PlacementContext(snapshot, request)
        parts = []
        for f, fkey in zip(static, keys, strict=True):
            filter_key = ("filter", id(f), fkey)
            verdict = cache.get(filter_key)
            if verdict is None:
                verdict = cache[filter_key] = FilterVerdicts(f, request, order, ctx)
            parts.append(verdict)
        hit = cache[shape_key] = ShapeVerdicts(parts, len(order))
    shape: ShapeVerdicts = hit
    return shape


def refresh_static_verdicts(snapshot: Snapshot, node_ids: Iterable[str]) -> None:
    """Recompute the memoised static verdicts of nodes whose static facts changed (a cordon, a
    label, readiness), for every filter and key seen so far: O(filter keys x changed nodes)
    instead of forgetting them all, which at thousands of nodes costs a full pass per key. The
    node set must be the one the memo was filled with (the caller starts a fresh memo otherwise)."""
    static = snapshot.static
    changed = [(i, static.order[i]) for i in (static.by_id.get(node_id) for node_id in node_ids) if i is not None]
    if not changed:
        return
    for entry in static.caches.values():
        if isinstance(entry, LabelBits):
            for i, node in changed:
                entry.refresh(i, node)
    for entry in static.caches.values():  # after the label index, which bulk verdicts read
        if isinstance(entry, FilterVerdicts):
            ctx = PlacementContext(snapshot, entry.request)
            for i, node in changed:
                entry.refresh(i, node, ctx)
        elif isinstance(entry, ShapeVerdicts):
            entry.stale = True  # recombined from its filters' verdicts when next used


MIN_FEASIBLE_NODES_TO_FIND = 100


def feasible_nodes_to_find(total: int, percentage: int | None) -> int:
    """How many feasible nodes end the search (kube-scheduler's numFeasibleNodesToFind)."""
    if total < MIN_FEASIBLE_NODES_TO_FIND or percentage == 100:
        return total
    if percentage is None:
        percentage = max(5, 50 - total // 125)
    return max(MIN_FEASIBLE_NODES_TO_FIND, total * percentage // 100)


@dataclass(slots=True)
class _Chain:
    """A request's filter chain: the dynamic filters, the memoised verdicts of the static ones,
    and per static filter the dynamic filters placed before it (for a node failing static filter
    k only those can still be its first reason; the static verdict is reused from the cache)."""

    dynamic: tuple[Filter, ...]
    verdicts: ShapeVerdicts | None
    before: list[tuple[Filter, ...]]


def _chain(snapshot: Snapshot, request: WorkloadRequest, config: PlacementConfig, ctx: PlacementContext) -> _Chain:
    active = tuple(f for f in config.filters if f.applies(request, ctx))
    static = tuple(f for f in active if f.static)
    dynamic = tuple(f for f in active if not f.static)
    verdicts = _shape_verdicts(snapshot, static, request) if static else None
    before = [tuple(g for g in active[:active.index(f)] if not g.static) for f in static]
    return _Chain(dynamic, verdicts, before)


def _scan(nodes: Sequence[NodeInfo], walk: Iterable[int], failures: list[tuple[int, Status] | None] | None,
          filter_chain: _Chain, request: WorkloadRequest, ctx: PlacementContext, to_find: int
          ) -> tuple[list[int], dict[str, Status], int, int]:
    """Walk nodes until `to_find` are feasible: (feasible positions, rejections seen node by
    node, nodes evaluated, position of the last node walked or -1 when the walk ran out).
    `failures` (the node-by-node walk only) is each node's first static rejection."""
    rejections: dict[str, Status] = {}
    feasible: list[int] = []
    dynamic, before = filter_chain.dynamic, filter_chain.before
    evaluated = 0
    for i in walk:
        node = nodes[i]
        evaluated += 1
        fail = None if failures is None else failures[i]
        if fail is not None:  # the node-by-node walk only
            status = fail[1]
            for f in before[fail[0]]:
                earlier = f.check(node, request, ctx)
                if earlier is not None:
                    status = earlier
                    break
            rejections[node.id] = status
            continue
        for f in dynamic:
            rejected = f.check(node, request, ctx)
            if rejected is not None:
                rejections[node.id] = rejected
                break
        else:
            feasible.append(i)
            if len(feasible) >= to_find:
                return feasible, rejections, evaluated, i
    return feasible, rejections, evaluated, -1


def _filter_nodes(snapshot: Snapshot, request: WorkloadRequest, config: PlacementConfig, ctx: PlacementContext
                  ) -> tuple[list[int], Rejections, int]:
    """The feasible nodes' positions, every rejection with its reason, and how many nodes were
    looked at."""
    nodes = snapshot.effective
    filter_chain = _chain(snapshot, request, config, ctx)
    verdicts = filter_chain.verdicts
    n = len(nodes)
    to_find = feasible_nodes_to_find(n, config.percentage_of_nodes_to_score)
    # When sampling, start at a per-workload offset in id order: deterministic, independent of
    # the caller's node order, and different workloads look at different parts of the cluster.
    start = stable_hash(request.id) % n if to_find < n else 0
    # The usual case (no dynamic filter precedes a static one for this request): a statically
    # rejected node's reason is its static verdict, so walk only the nodes passing every static
    # filter and take the static rejections of the walked range afterwards as bit-set groups:
    # the same decision and explanation as the node-by-node walk, without a Python step per
    # rejected node.
    if verdicts is not None and any(filter_chain.before):
        walk: Iterable[int] = chain(range(start, n), range(start))
        feasible, rejections, evaluated, _ = _scan(nodes, walk, verdicts.rows(), filter_chain, request, ctx, to_find)
        return feasible, Rejections(rejections, (), snapshot.static.order), evaluated
    passing = verdicts.passing() if verdicts is not None else range(n)
    k0 = bisect_left(passing, start)
    feasible, rejections, _, last = _scan(nodes, chain(passing[k0:], passing[:k0]), None, filter_chain, request, ctx,
                                          to_find)
    evaluated = n if last < 0 else (last - start) % n + 1  # last < 0: every node was looked at
    static_groups: tuple[tuple[Status, int], ...] = ()
    if verdicts is not None:
        static_groups = verdicts.within((1 << n) - 1 if last < 0 else range_bits(start, last, n))
    return feasible, Rejections(rejections, static_groups, snapshot.static.order), evaluated


def decide(
    snapshot: Snapshot, request: WorkloadRequest, config: PlacementConfig = DEFAULT_CONFIG
) -> Decision:
    """Filter every node (first rejecting filter is its reason), score the feasible ones, pick one.

    Pure and deterministic: the same snapshot, request and config give the same Decision whatever
    the order of ``snapshot.nodes``. Reservations must already be applied to ``snapshot``.
    """
    ctx = PlacementContext(snapshot, request)
    feasible, rejected_nodes, evaluated = _filter_nodes(snapshot, request, config, ctx)
    n = len(snapshot.effective)
    if not feasible:
        reasons = _NO_REASONS
        if config.detail_nodes and n:
            sample = rejected_nodes.sample(config.detail_per_reason, config.detail_nodes)
            reasons = MappingProxyType(every_reason(snapshot, request, config.filters, sample, ctx))
        return Decision(request.id, None, [], rejected_nodes, 0, n, evaluated, reasons)
    nodes = snapshot.effective
    scores = _rank(nodes, feasible, request, config, ctx)
    chosen = scores[0].node_id
    chosen_node = snapshot.node(chosen) if request.devices else None
    given = pick_devices(chosen_node, request) if chosen_node is not None else ()
    return Decision(request.id, chosen, scores, rejected_nodes, len(feasible), n, evaluated, devices=given,
                    feasible_positions=feasible, order=nodes)


def _rank(nodes: Sequence[NodeInfo], feasible: list[int], request: WorkloadRequest, config: PlacementConfig,
          ctx: PlacementContext) -> list[NodeScore]:
    """The top candidates among the feasible nodes, best first, with their score breakdowns."""
    # Weights are normalised so totals stay in [0, 100] whatever the configuration.
    weighted = [(s, config.weight(s.name)) for s in config.scorers if config.weight(s.name) > 0]
    weight_sum = sum(w for _, w in weighted)
    per_node: list[tuple[Scorer, float]] = []
    constants: dict[str, float] = {}
    base = 0.0
    for scorer, w in weighted:
        norm = w / weight_sum
        c = scorer.constant(request, ctx)
        if c is None:
            per_node.append((scorer, norm))
        else:
            constants[scorer.name] = norm * c
            base += norm * c

    candidates = [nodes[i] for i in feasible]
    sums = [base] * len(candidates)
    for scorer, norm in per_node:
        values = scorer.score_many(candidates, request, ctx)
        sums = [t + norm * v for t, v in zip(sums, values, strict=True)]
    totals = list(zip(sums, feasible, strict=True))

    # Deterministic tie-break: score desc, then a per-workload stable hash (so ties spread across
    # nodes instead of always favouring the lowest id): blake2b-64 of "{workload_id}/{node_id}"
    # ascending, then node id. Only the pool of nodes scoring >= the k-th best pays for hashing.
    k = config.top_candidates
    if len(totals) > k:
        threshold = heapq.nlargest(k, totals)[-1][0]
        pool = [t for t in totals if t[0] >= threshold]
    else:
        pool = totals
    wid = request.id
    pool.sort(key=lambda t: (-t[0], stable_hash(f"{wid}/{nodes[t[1]].id}"), nodes[t[1]].id))

    scores = []
    for total, i in pool[:k]:
        breakdown = dict(constants)
        for scorer, norm in per_node:
            breakdown[scorer.name] = norm * scorer.score(nodes[i], request, ctx)
        ordered = {s.name: breakdown[s.name] for s, _ in weighted}
        scores.append(NodeScore(nodes[i].id, total, ordered))
    return scores


def place_many(
    snapshot: Snapshot,
    requests: Sequence[WorkloadRequest],
    ledger: Reservations,
    config: PlacementConfig = DEFAULT_CONFIG,
) -> list[Decision]:
    """Place requests in order, reserving in ``ledger`` after each success.

    ``snapshot`` is read through the ledger's current view (existing reservations count), and each
    new reservation is folded into the next decision's view, so a burst never double-books a node.
    The reservation id is the workload id; the scheduler releases it once the agent commits.
    """
    decisions, _ = place_many_from(snapshot.with_reservations(ledger.view()), requests, ledger, config)
    return decisions


def place_many_from(
    current: Snapshot,
    requests: Sequence[WorkloadRequest],
    ledger: Reservations,
    config: PlacementConfig = DEFAULT_CONFIG,
) -> tuple[list[Decision], Snapshot]:
    """``place_many`` for a caller that keeps the overlaid snapshot between calls.

    ``current`` must already show every reservation in ``ledger``; the returned snapshot shows the
    new ones too. Overlaying the whole ledger costs O(reserved nodes) per call, which a scheduler
    placing one workload at a time would otherwise pay for every placement.
    """
    batch = PlacementBatch(current, ledger, config)
    decisions = [batch.place(request) for request in requests]
    return decisions, batch.snapshot()


class PlacementBatch:
    """Decisions one at a time over one overlaid snapshot, reserving in ``ledger`` after each
    success (``place_many_from`` step by step: a caller that measures each decision holds the
    clock, the engine does not)."""

    __slots__ = ("_batch", "_by_node", "_current", "_effective", "_groups", "config", "ledger")

    def __init__(self, current: Snapshot, ledger: Reservations, config: PlacementConfig = DEFAULT_CONFIG) -> None:
        # Each reservation changes one node. Rather than copying the whole view per decision
        # (O(nodes) each), the batch works on private copies made once: the snapshots decide()
        # sees during the batch share them and never leave it; snapshot() hands out its own.
        self._current = current
        self.ledger = ledger
        self.config = config
        self._effective = list(current.effective)
        self._by_node = dict(current.reservations.by_node)
        self._groups = dict(current.reserved_groups)
        self._batch = Snapshot.derive(current, ReservationView(MappingProxyType(self._by_node)), self._effective,
                                      self._groups)

    def place(self, request: WorkloadRequest) -> Decision:
        decision = decide(self._batch, request, self.config)
        node_id = decision.node_id
        if node_id is None:
            return decision
        self.ledger.reserve(
            Reservation(request.id, node_id, request.cpu_millicores, request.memory_mb, request.disk_mb,
                        request.group, decision.devices)
        )
        on_node = self.ledger.on_node(node_id)
        current = self._current
        i = current.static.by_id[node_id]
        self._effective[i] = apply_reserved(current.static.order[i], on_node)
        self._by_node[node_id] = on_node
        held = self._groups.get(request.group, frozenset())
        if i not in held:
            self._groups[request.group] = held | {i}
        return decision

    def snapshot(self) -> Snapshot:
        """The snapshot showing every reservation the batch made; ends the batch (the snapshot
        takes over its spread groups)."""
        return Snapshot.derive(self._current, self._batch.reservations, tuple(self._effective), self._groups)
