"""What a decision saw beyond the store, recorded so that it can be replayed (pure).

A decision reads a snapshot built from the store at one revision, plus things the store does
not hold at that revision: reservations of placements decided but not yet durable (in flight),
nodes stored Ready whose agent this replica has not heard from yet, observed utilisation (when
load-aware scoring is on), and the engine's own configuration. `seen` records those compactly
and bounded: only the in-flight reservations on nodes the decision looked at through them (the
feasible nodes, those a dynamic filter rejected, a pending decision's detailed sample; for a
spread request also its group's reservations anywhere, which count in domains), summed per
node. `replay_reservations` turns a record back into reservations for the same snapshot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .engine import Decision, PlacementConfig
from .snapshot import NodeInfo, Reservation, WorkloadRequest
from .verdicts import Rejections

# Bumped whenever a change to filters, scorers or the walk would make a recorded decision come
# out differently from the same inputs.
ENGINE_VERSION = "e1"
MAX_RECORDED_NODES = 256  # in-flight or observed entries kept per decision; more: `omitted`
MAX_UNHEARD = 64
_OTHER = "\0other"  # the group of a replayed reservation of another service (counts, never matches)


def engine_tag(config: PlacementConfig) -> str:
    """The engine version and a digest of the configuration a decision depends on."""
    text = repr((ENGINE_VERSION, sorted(config.weights.items()), [f.name for f in config.filters],
                 [s.name for s in config.scorers], config.top_candidates, config.percentage_of_nodes_to_score,
                 config.detail_nodes, config.detail_per_reason))
    return f"{ENGINE_VERSION}-{hashlib.blake2b(text.encode(), digest_size=4).hexdigest()}"


class InflightTotals:
    """In-flight reservations (decided, not yet in the store), summed per node and per group."""

    __slots__ = ("by_node", "devices", "groups", "items")

    def __init__(self) -> None:
        self.items: dict[str, Reservation] = {}
        self.by_node: dict[str, list[int]] = {}  # node -> [cpu, memory, disk, count]
        self.groups: dict[str, dict[str, int]] = {}  # group -> node -> count
        self.devices: dict[str, set[str]] = {}  # node -> device ids given

    def __len__(self) -> int:
        return len(self.items)

    def add(self, r: Reservation) -> None:
        self.remove(r.id)
        self.items[r.id] = r
        self._count(r, 1)

    def remove(self, rid: str) -> None:
        r = self.items.pop(rid, None)
        if r is not None:
            self._count(r, -1)

    def clear(self) -> None:
        self.items.clear()
        self.by_node.clear()
        self.groups.clear()
        self.devices.clear()

    def _count(self, r: Reservation, sign: int) -> None:
        tot = self.by_node.setdefault(r.node_id, [0, 0, 0, 0])
        tot[0] += sign * r.cpu_millicores
        tot[1] += sign * r.memory_mb
        tot[2] += sign * r.disk_mb
        tot[3] += sign
        if tot[3] == 0:
            del self.by_node[r.node_id]
        if r.devices:
            held = self.devices.setdefault(r.node_id, set())
            if sign > 0:
                held.update(r.devices)
            else:
                held.difference_update(r.devices)
                if not held:
                    del self.devices[r.node_id]
        per = self.groups.setdefault(r.service, {})
        left = per.get(r.node_id, 0) + sign
        if left:
            per[r.node_id] = left
        else:
            per.pop(r.node_id, None)
            if not per:
                del self.groups[r.service]


def _looked_at(decision: Decision, request: WorkloadRequest, inflight: InflightTotals) -> list[str]:
    """The nodes with in-flight reservations whose figures the decision read."""
    rejections = decision.rejections
    one_by_one = rejections.one_by_one() if isinstance(rejections, Rejections) else rejections
    feasible = decision.feasible_nodes
    by_node = inflight.by_node
    if len(by_node) <= len(feasible) + len(one_by_one):
        seen = set(feasible)
        out = {n for n in by_node if n in seen or n in one_by_one}
    else:
        out = {n for n in feasible if n in by_node} | {n for n in one_by_one if n in by_node}
    # A pending decision's every-reason detail runs every filter on its sample of nodes, the
    # statically rejected ones too: their figures are read as well.
    out.update(n for n in decision.reasons if n in by_node)
    if request.spread_label or request.spread_constraints:
        out.update(inflight.groups.get(request.group, {}))
    return sorted(out)


def seen(decision: Decision, request: WorkloadRequest, revision: int, engine: str, inflight: InflightTotals,
         unheard: Iterable[str] = (), observed: Callable[[str], NodeInfo | None] | None = None) -> dict[str, Any]:
    """The record of what `decision` saw beyond the store at `revision` (JSON-ready, bounded).
    `observed`: the nodes as the decision saw them, when observed utilisation was scored."""
    out: dict[str, Any] = {"rev": revision, "engine": engine}
    omitted = 0
    if inflight.by_node:
        nodes = _looked_at(decision, request, inflight)
        omitted += max(0, len(nodes) - MAX_RECORDED_NODES)
        if nodes:
            out["inflight"] = _encode(nodes[:MAX_RECORDED_NODES], inflight, request.group)
    quiet = sorted(unheard)
    if quiet:
        omitted += max(0, len(quiet) - MAX_UNHEARD)
        out["unheard"] = quiet[:MAX_UNHEARD]
    scored = decision.feasible_nodes if observed is not None else ()
    if observed is not None and scored:
        omitted += max(0, len(scored) - MAX_RECORDED_NODES)
        load = {}
        for n in sorted(scored)[:MAX_RECORDED_NODES]:
            info = observed(n)
            if info is not None and info.observed_cpu_percent is not None:
                load[n] = [info.observed_cpu_percent, info.observed_memory_mb]
        if load:
            out["observed"] = load
    if omitted:
        out["omitted"] = omitted
    return out


def _encode(nodes: list[str], inflight: InflightTotals, group: str) -> str:
    """`node=cpu,memory,disk,instances,of-the-group[+device;device] ...`: one string rather than
    nested JSON, cheaper to write, store and parse for every status of a burst (node ids are
    DNS-like and device ids have no `+`, `;`, `=` or space)."""
    mine = inflight.groups.get(group, {})
    held = inflight.devices
    parts = []
    for n in nodes:
        cpu, memory, disk, count = inflight.by_node[n]
        devices = f"+{';'.join(sorted(held[n]))}" if n in held else ""
        parts.append(f"{n}={cpu},{memory},{disk},{count},{mine.get(n, 0)}{devices}")
    return " ".join(parts)


def inflight_entries(record: Mapping[str, Any]) -> dict[str, tuple[int, int, int, int, int, tuple[str, ...]]]:
    """A record's in-flight totals per node: (cpu, memory, disk, instances, of the request's
    group, device ids)."""
    out = {}
    for part in str(record.get("inflight", "")).split():
        node, _, rest = part.partition("=")
        figures, _, devices = rest.partition("+")
        cpu, memory, disk, count, same = (int(x) for x in figures.split(","))
        out[node] = (cpu, memory, disk, count, same, tuple(devices.split(";")) if devices else ())
    return out


def replay_reservations(record: Mapping[str, Any], group: str) -> list[Reservation]:
    """The in-flight reservations a record describes, as reservations of the same totals: per
    node one carrying the resources, then one per further instance; `group` is the request's
    (a reservation of another group only counts toward the node's workloads)."""
    out = []
    for node, (cpu, memory, disk, count, same, held) in sorted(inflight_entries(record).items()):
        for k in range(count):
            first = k == 0
            out.append(Reservation(f"\0replay/{node}/{k}", node, cpu if first else 0, memory if first else 0,
                                   disk if first else 0, group if k < same else _OTHER, held if first else ()))
    return out
