"""Read-only inputs of the placement engine.

The scheduler converts its own model into these types; the engine never sees anything else
(Nomad-style: decisions are a pure function of a snapshot plus a request).

Over 500 lines, kept whole while scheduler/ is reorganised into role packages (#32): the
engine's input types (nodes, requests, constraints) and the indexed snapshot are read together
by every filter and scorer; the reservation ledger (Reservation ... Reservations,
apply_reserved) is the part to move out once the packages settle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from types import MappingProxyType
from typing import Any, Literal

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
ConstraintOp = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _frozen_map(value: Mapping[str, Any]) -> Mapping[str, Any]:
    # Copy so a caller mutating its dict later cannot change a snapshot behind our back. A plain
    # dict typed as Mapping (not a MappingProxyType): proxy .get() is ~2x slower in the hot loop.
    return dict(value) if value else _EMPTY


def stable_hash(text: str) -> int:
    """64-bit hash that is identical across processes (unlike ``hash()``)."""
    return int.from_bytes(blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = "NoSchedule"

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: str = ""  # "" tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        # Kubernetes semantics: an empty key with Exists tolerates everything.
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class LabelConstraint:
    key: str
    operator: ConstraintOp
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.operator in ("Gt", "Lt"):
            if len(self.values) != 1:
                raise ValueError(f"{self.operator} constraint on {self.key!r} needs exactly one value")
            try:
                int(self.values[0])
            except ValueError:
                raise ValueError(f"{self.operator} constraint on {self.key!r} needs an integer") from None
        elif self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"{self.operator} constraint on {self.key!r} needs values")
        object.__setattr__(self, "values", tuple(self.values))

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if value is None:
            return False
        try:
            have = int(value)
        except ValueError:
            return False  # a non-integer label never satisfies Gt/Lt
        want = int(self.values[0])
        return have > want if op == "Gt" else have < want

    def __str__(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        if self.operator in ("Gt", "Lt"):
            return f"{self.key} {self.operator} {self.values[0]}"
        return f"{self.key} {self.operator} ({','.join(self.values)})"


@dataclass(frozen=True, slots=True)
class DeviceSlot:
    """One device of a node (a GPU): `id` is what the runtime is given."""

    id: str
    vendor: str
    memory_mb: int = 0


@dataclass(frozen=True, slots=True)
class DeviceNeed:
    """`count` whole devices of `vendor`, each with at least `min_memory_mb`."""

    vendor: str
    count: int = 1
    min_memory_mb: int = 0

    @property
    def resource(self) -> str:
        """Kubernetes' extended-resource name: nvidia.com/gpu."""
        return f"{self.vendor}.com/gpu" if "." not in self.vendor else self.vendor


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: str
    ready: bool = True
    schedulable: bool = True  # False when cordoned or draining
    runtimes: frozenset[str] = frozenset({"container"})
    runtime_features: frozenset[str] = frozenset()
    storage_drivers: frozenset[str] = frozenset()  # names and "<driver>:<kind>" (placement.storage_offers)
    storage_missing: Mapping[str, str] = field(default_factory=lambda: _EMPTY, hash=False)  # why a kind is missing
    cpu_millicores: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY, hash=False)
    taints: tuple[Taint, ...] = ()
    committed_cpu: int = 0
    committed_memory_mb: int = 0
    committed_disk_mb: int = 0
    workload_count: int = 0
    service_counts: Mapping[str, int] = field(default_factory=lambda: _EMPTY, hash=False)
    # Observed utilisation (recent p95 of the node's heartbeats; None: not measured). Only the
    # optional `observed_load` scorer reads them: requests stay the fit rule.
    observed_cpu_percent: float | None = None
    observed_memory_mb: int | None = None
    devices: tuple[DeviceSlot, ...] = ()
    devices_used: frozenset[str] = frozenset()  # ids given to assigned (and reserved) instances

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtimes", frozenset(self.runtimes))
        object.__setattr__(self, "runtime_features", frozenset(self.runtime_features))
        object.__setattr__(self, "storage_drivers", frozenset(self.storage_drivers))
        object.__setattr__(self, "labels", _frozen_map(self.labels))
        object.__setattr__(self, "storage_missing", _frozen_map(self.storage_missing))
        object.__setattr__(self, "taints", tuple(self.taints))
        object.__setattr__(self, "service_counts", _frozen_map(self.service_counts))

    @property
    def free_cpu(self) -> int:
        return self.cpu_millicores - self.committed_cpu

    @property
    def free_memory_mb(self) -> int:
        return self.memory_mb - self.committed_memory_mb

    @property
    def free_disk_mb(self) -> int:
        return self.disk_mb - self.committed_disk_mb


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """At most `max_skew` more replicas of the request's group in one value of `label` than in
    the emptiest value its nodes could take; `hard`: refuse a node that would exceed it
    (DoNotSchedule), else only a preference (ScheduleAnyway, scored by `spread`)."""

    label: str
    max_skew: int = 1
    hard: bool = True

    def __post_init__(self) -> None:
        if self.max_skew < 1 or not self.label:
            raise ValueError("a spread constraint needs a label and max_skew >= 1")


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    id: str
    type: str = "container"
    cpu_millicores: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    node_selector: Mapping[str, str] = field(default_factory=lambda: _EMPTY, hash=False)
    constraints: tuple[LabelConstraint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    volume_drivers: frozenset[str] = frozenset()
    pinned_node: str | None = None  # affinity imposed by an existing node-local volume
    excluded_nodes: frozenset[str] = frozenset()
    required_features: frozenset[str] = frozenset()
    service: str = ""  # spread group; "" means the workload id
    spread_label: str | None = None  # topology label, e.g. "zone"
    spread_constraints: tuple[SpreadConstraint, ...] = ()
    priority: int = 0  # preemption only (placement/preemption.py): filters and scores ignore it
    devices: tuple[DeviceNeed, ...] = ()

    def __post_init__(self) -> None:
        if min(self.cpu_millicores, self.memory_mb, self.disk_mb) < 0:
            raise ValueError(f"workload {self.id!r} requests negative resources")
        object.__setattr__(self, "node_selector", _frozen_map(self.node_selector))
        object.__setattr__(self, "constraints", tuple(self.constraints))
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        object.__setattr__(self, "volume_drivers", frozenset(self.volume_drivers))
        object.__setattr__(self, "excluded_nodes", frozenset(self.excluded_nodes))
        object.__setattr__(self, "required_features", frozenset(self.required_features))
        object.__setattr__(self, "spread_constraints", tuple(self.spread_constraints))
        object.__setattr__(self, "devices", tuple(self.devices))

    @property
    def group(self) -> str:
        return self.service or self.id


# --------------------------------------------------------------------------- reservations


@dataclass(frozen=True, slots=True)
class Reservation:
    id: str
    node_id: str
    cpu_millicores: int
    memory_mb: int
    disk_mb: int
    service: str = ""
    devices: tuple[str, ...] = ()  # the node's devices the placement was given


@dataclass(frozen=True, slots=True)
class ReservedOnNode:
    """Sum of in-flight reservations on one node."""

    cpu_millicores: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    workloads: int = 0
    services: Mapping[str, int] = field(default_factory=lambda: _EMPTY, hash=False)
    devices: frozenset[str] = frozenset()

    def plus(self, r: Reservation, sign: int = 1) -> ReservedOnNode:
        services = dict(self.services)
        if r.service:
            left = services.get(r.service, 0) + sign
            if left:
                services[r.service] = left
            else:
                services.pop(r.service, None)
        return ReservedOnNode(
            self.cpu_millicores + sign * r.cpu_millicores,
            self.memory_mb + sign * r.memory_mb,
            self.disk_mb + sign * r.disk_mb,
            self.workloads + sign,
            _frozen_map(services),
            (self.devices | frozenset(r.devices) if sign > 0 else self.devices - frozenset(r.devices))
            if r.devices else self.devices,
        )


@dataclass(frozen=True, slots=True)
class ReservationView:
    """Immutable per-node totals of a :class:`Reservations` ledger at one instant."""

    by_node: Mapping[str, ReservedOnNode] = field(default_factory=lambda: _EMPTY, hash=False)

    def __bool__(self) -> bool:
        return bool(self.by_node)


EMPTY_VIEW = ReservationView()


class Reservations:
    """Mutable ledger of in-flight reservations, owned by the scheduler.

    Capacity is held from the moment a decision is made until the agent reports the workload
    as committed (then the scheduler releases it); this is what stops a burst from double-booking.
    Per-node totals are maintained incrementally so :meth:`view` is O(nodes with reservations).
    """

    __slots__ = ("_by_id", "_by_node")

    def __init__(self) -> None:
        self._by_id: dict[str, Reservation] = {}
        self._by_node: dict[str, ReservedOnNode] = {}

    def reserve(self, reservation: Reservation) -> None:
        if reservation.id in self._by_id:
            raise ValueError(f"reservation {reservation.id!r} already exists")
        self._by_id[reservation.id] = reservation
        self._by_node[reservation.node_id] = self._by_node.get(reservation.node_id, ReservedOnNode()).plus(
            reservation
        )

    def release(self, reservation_id: str) -> Reservation | None:
        r = self._by_id.pop(reservation_id, None)
        if r is None:
            return None
        left = self._by_node[r.node_id].plus(r, -1)
        if left.workloads:
            self._by_node[r.node_id] = left
        else:
            del self._by_node[r.node_id]
        return r

    def get(self, reservation_id: str) -> Reservation | None:
        return self._by_id.get(reservation_id)

    def on_node(self, node_id: str) -> ReservedOnNode:
        return self._by_node.get(node_id, ReservedOnNode())

    def view(self) -> ReservationView:
        return ReservationView(MappingProxyType(dict(self._by_node))) if self._by_node else EMPTY_VIEW

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, reservation_id: object) -> bool:
        return reservation_id in self._by_id

    def __iter__(self) -> Iterator[Reservation]:
        return iter(list(self._by_id.values()))


def apply_reserved(node: NodeInfo, reserved: ReservedOnNode) -> NodeInfo:
    """The node as filters must see it: committed + reserved."""
    services = dict(node.service_counts)
    for name, n in reserved.services.items():
        services[name] = services.get(name, 0) + n
    return dataclasses.replace(
        node,
        committed_cpu=node.committed_cpu + reserved.cpu_millicores,
        committed_memory_mb=node.committed_memory_mb + reserved.memory_mb,
        committed_disk_mb=node.committed_disk_mb + reserved.disk_mb,
        workload_count=node.workload_count + reserved.workloads,
        service_counts=services,
        devices_used=node.devices_used | reserved.devices if reserved.devices else node.devices_used,
    )


# --------------------------------------------------------------------------- snapshot


def _taint_kinds(nodes: Iterable[NodeInfo]) -> tuple[bool, bool]:
    """Whether any node carries a hard taint (NoSchedule, NoExecute), and any a soft one."""
    effects = {t.effect for n in nodes for t in n.taints}
    return bool(effects - {"PreferNoSchedule"}), "PreferNoSchedule" in effects


class StaticIndex:
    """Facts derived once per set of base nodes and shared by every reservation overlay.

    Only request-independent data lives here; anything touched by reservations does not.
    """

    __slots__ = ("by_id", "caches", "has_hard_taints", "has_soft_taints", "order", "service_nodes")

    def __init__(self, nodes: Iterable[NodeInfo]) -> None:
        ordered = sorted(nodes, key=lambda n: n.id)  # node-order independence starts here
        self.order: tuple[NodeInfo, ...] = tuple(ordered)
        self.by_id: dict[str, int] = {n.id: i for i, n in enumerate(ordered)}
        if len(self.by_id) != len(ordered):
            raise ValueError("duplicate node ids in snapshot")
        self.has_hard_taints, self.has_soft_taints = _taint_kinds(ordered)
        services: dict[str, list[int]] = {}
        for i, n in enumerate(ordered):
            for name, count in n.service_counts.items():
                if count:
                    services.setdefault(name, []).append(i)
        self.service_nodes: dict[str, tuple[int, ...]] = {k: tuple(v) for k, v in services.items()}
        # Lazily filled, request-type keyed caches (e.g. which nodes pass the static filters).
        self.caches: dict[Any, Any] = {}

    def replacing(self, changed: Iterable[NodeInfo]) -> StaticIndex:
        """The same node set with some nodes' facts replaced: O(changed nodes) index upkeep
        instead of sorting and indexing every node again. The memo is shared (see
        Snapshot.sharing_static_caches for when that is sound)."""
        new = object.__new__(StaticIndex)
        order = list(self.order)
        services = dict(self.service_nodes)
        for node in changed:
            i = self.by_id[node.id]  # KeyError: not the same node set
            old = order[i]
            order[i] = node
            for name in old.service_counts.keys() - {k for k, c in node.service_counts.items() if c}:
                left = tuple(j for j in services.get(name, ()) if j != i)
                if left:
                    services[name] = left
                else:
                    services.pop(name, None)
            for name, count in node.service_counts.items():
                held = services.get(name, ())
                if count and i not in held:
                    services[name] = tuple(sorted((*held, i)))
        new.order = tuple(order)
        new.by_id = self.by_id
        new.has_hard_taints, new.has_soft_taints = _taint_kinds(order)
        new.service_nodes = services
        new.caches = self.caches
        return new


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Immutable cluster view: base nodes plus an optional overlay of reservations."""

    nodes: tuple[NodeInfo, ...]
    reservations: ReservationView = EMPTY_VIEW
    # Request-independent facts of the base nodes, shared by every overlay of them (read-only
    # for the engine, filters and scorers; only the snapshot builds one).
    static: StaticIndex = field(init=False, repr=False, compare=False)
    # A tuple, except inside place_many_from, which overlays its batch on a private list.
    _effective: Sequence[NodeInfo] = field(init=False, repr=False, compare=False)
    # Spread group -> positions of nodes where reservations hold members of it (the base's own
    # placements are in static.service_nodes), so spreading never scans the whole ledger.
    reserved_groups: Mapping[str, frozenset[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        static = StaticIndex(self.nodes)
        object.__setattr__(self, "static", static)
        object.__setattr__(self, "_effective", _overlay(static, static.order, self.reservations))
        object.__setattr__(self, "reserved_groups", _groups_of(static, self.reservations))

    @classmethod
    def _assemble(cls, nodes: tuple[NodeInfo, ...], view: ReservationView, static: StaticIndex,
                  effective: Sequence[NodeInfo], reserved_groups: Mapping[str, frozenset[int]]) -> Snapshot:
        # Skips __post_init__: the caller brings a static index it already has.
        snap = object.__new__(cls)
        object.__setattr__(snap, "nodes", nodes)
        object.__setattr__(snap, "reservations", view)
        object.__setattr__(snap, "static", static)
        object.__setattr__(snap, "_effective", effective)
        object.__setattr__(snap, "reserved_groups", reserved_groups)
        return snap

    @classmethod
    def derive(cls, base: Snapshot, view: ReservationView, effective: Sequence[NodeInfo],
               reserved_groups: Mapping[str, frozenset[int]]) -> Snapshot:
        """`base`'s nodes seen through `view`, whose folded-in nodes (`effective`) and spread
        groups the caller computed (the engine's batch overlay); the static index is reused, so
        an overlay costs O(nodes) copies only."""
        return cls._assemble(base.nodes, view, base.static, effective, reserved_groups)

    def replacing(self, changed: Sequence[NodeInfo]) -> Snapshot:
        """This snapshot's node set with some nodes' facts replaced (every id must already be in
        it), without reservations; shares the static-verdict memo, so the caller must refresh
        the verdicts of nodes whose static facts changed (refresh_static_verdicts)."""
        static = self.static.replacing(changed)
        return Snapshot._assemble(static.order, EMPTY_VIEW, static, static.order, {})

    def sharing_static_caches(self, caches: dict[Any, Any]) -> Snapshot:
        """This snapshot, memoising its static-filter verdicts in `caches` (shared with earlier
        snapshots). Only for a caller that knows the node set and every node's static facts
        (readiness, cordon, labels, taints, runtimes) are the same as when `caches` was filled:
        capacity may differ, static verdicts cannot."""
        self.static.caches = caches
        return self

    def with_reservations(self, view: ReservationView) -> Snapshot:
        """Same base nodes seen through ``view`` (replaces, never stacks, any earlier overlay)."""
        return Snapshot.derive(self, view, _overlay(self.static, self.static.order, view),
                                _groups_of(self.static, view))

    @property
    def effective(self) -> Sequence[NodeInfo]:
        """Nodes sorted by id, with reservations folded into the committed figures."""
        return self._effective

    def node(self, node_id: str) -> NodeInfo | None:
        i = self.static.by_id.get(node_id)
        return None if i is None else self._effective[i]

    def base_node(self, node_id: str) -> NodeInfo | None:
        i = self.static.by_id.get(node_id)
        return None if i is None else self.static.order[i]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.static.order)

    def __len__(self) -> int:
        return len(self._effective)


def _groups_of(static: StaticIndex, view: ReservationView) -> dict[str, frozenset[int]]:
    groups: dict[str, set[int]] = {}
    for node_id, reserved in view.by_node.items():
        i = static.by_id.get(node_id)
        if i is not None:
            for name, count in reserved.services.items():
                if count:
                    groups.setdefault(name, set()).add(i)
    return {k: frozenset(v) for k, v in groups.items()}


def _overlay(static: StaticIndex, order: tuple[NodeInfo, ...], view: ReservationView) -> tuple[NodeInfo, ...]:
    if not view:
        return order
    effective = list(order)
    for node_id, reserved in view.by_node.items():
        i = static.by_id.get(node_id)
        if i is not None:  # a reservation on a vanished node simply no longer counts
            effective[i] = apply_reserved(order[i], reserved)
    return tuple(effective)
