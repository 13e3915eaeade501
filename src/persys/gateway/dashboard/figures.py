"""Pure functions over workload summaries and node views: the overview's counts and totals and
the lists' filters. No I/O: table-driven tests in tests/gateway/dashboard_cases.yaml."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_FILTER_CHARS = 253


class FilterProblem(ValueError):
    """A filter the user typed that means nothing (named, shown on the page as a 400)."""


@dataclass(frozen=True, slots=True)
class Capacity:
    allocatable: int = 0
    requested: int = 0
    used: int = 0


@dataclass(slots=True)
class Overview:
    nodes: int = 0
    nodes_by_status: dict[str, int] = field(default_factory=dict)
    workloads: int = 0
    workloads_by_phase: dict[str, int] = field(default_factory=dict)
    cpu: Capacity = Capacity()  # millicores
    memory: Capacity = Capacity()  # MiB
    disk: Capacity = Capacity()  # MiB


def node_status(n: Mapping[str, Any]) -> str:
    """Ready, NotReady, ... with Draining or Cordoned when an operator set them."""
    status = str(n.get("status") or "Unknown")
    if n.get("draining"):
        return f"{status},Draining"
    return f"{status},Cordoned" if n.get("cordoned") else status


def overview(nodes: Iterable[Mapping[str, Any]], workloads: Iterable[Mapping[str, Any]]) -> Overview:
    return overview_of(nodes, phase_counts(workloads))


def phase_of(w: Mapping[str, Any]) -> str:
    return str(w.get("phase") or "Unknown")


def phase_counts(workloads: Iterable[Mapping[str, Any]]) -> Counter[str]:
    return Counter(phase_of(w) for w in workloads)


def node_share(n: Mapping[str, Any]) -> tuple[str, tuple[int, ...]]:
    """What one node adds to the overview: its status, and CPU, memory, disk as (allocatable,
    requested, used) each."""
    caps = n.get("capabilities") or {}
    alloc = n.get("allocated") or {}
    usage = n.get("usage") or {}
    ready = n.get("status") == "Ready"  # allocatable: what placement may still use
    cpu_cap = int(caps.get("cpuMillicores", 0) or 0)
    return node_status(n), (
        cpu_cap if ready else 0, int(alloc.get("cpuMillicores", 0) or 0),
        # Used: what the agents measured (cpuPercent of the node's cores, memory in MiB).
        int(float(usage.get("cpuPercent", 0) or 0) * cpu_cap / 100),
        int(caps.get("memoryMb", 0) or 0) if ready else 0, int(alloc.get("memoryMb", 0) or 0),
        int(usage.get("memoryUsedMb", 0) or 0),
        int(caps.get("diskMb", 0) or 0) if ready else 0, int(alloc.get("diskMb", 0) or 0),
        int(usage.get("diskUsedMb", 0) or 0))


class NodeSums:
    """The nodes' part of the overview, kept as nodes come, change and go (`add` with sign -1
    takes a node's old document out): the overview walks no node per page."""

    def __init__(self, nodes: Iterable[Mapping[str, Any]] = ()) -> None:
        self.by_status: Counter[str] = Counter()
        self.sums = [0] * 9
        self.count = 0
        for n in nodes:
            self.add(n)

    def add(self, n: Mapping[str, Any], sign: int = 1) -> None:
        status, share = node_share(n)
        self.by_status[status] += sign
        self.count += sign
        self.sums = [a + sign * b for a, b in zip(self.sums, share, strict=True)]

    def overview(self, phases: Mapping[str, int]) -> Overview:
        v = self.sums
        live = {k: c for k, c in phases.items() if c > 0}
        return Overview(self.count, dict(sorted((k, c) for k, c in self.by_status.items() if c > 0)),
                        sum(live.values()), dict(sorted(live.items())), Capacity(*v[0:3]), Capacity(*v[3:6]),
                        Capacity(*v[6:9]))


def overview_of(nodes: Iterable[Mapping[str, Any]], phases: Mapping[str, int]) -> Overview:
    """The overview's figures from every node and the workloads' counts by phase."""
    return NodeSums(nodes).overview(phases)


def parse_labels(text: str) -> dict[str, str | None]:
    """`app=web,tier` -> {"app": "web", "tier": None} (None: the key present, any value)."""
    if len(text) > MAX_FILTER_CHARS:
        raise FilterProblem(f"label: at most {MAX_FILTER_CHARS} characters")
    out: dict[str, str | None] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not key or any(c.isspace() for c in key):
            raise FilterProblem(f"label: {part!r} is not key or key=value")
        out[key] = value.strip() if eq else None
    return out


def _labels_match(labels: Mapping[str, str], wanted: Mapping[str, str | None]) -> bool:
    return all(k in labels and (v is None or labels[k] == v) for k, v in wanted.items())


def filter_workloads(workloads: Iterable[Mapping[str, Any]], label: str = "", type_: str = "", phase: str = "",
                     node: str = "", name: str = "") -> list[Mapping[str, Any]]:
    """Those matching every filter given, by name."""
    wanted = parse_labels(label)
    out = [w for w in workloads
           if (not type_ or w.get("type") == type_)
           and (not phase or w.get("phase") == phase)
           and (not node or node in (w.get("nodes") or ()) or w.get("node") == node)
           and (not name or name in str(w.get("name", "")))
           and (not wanted or _labels_match(w.get("labels") or {}, wanted))]
    return sorted(out, key=lambda w: str(w.get("name", "")))


def filter_nodes(nodes: Iterable[Mapping[str, Any]], query: str = "", status: str = "", label: str = ""
                 ) -> list[Mapping[str, Any]]:
    """Nodes whose id or a label value contains `query`, with that status, matching `label`."""
    wanted = parse_labels(label)
    q = query.strip().lower()
    out = [n for n in nodes
           if (not status or status in node_status(n).split(","))
           and (not wanted or _labels_match(n.get("labels") or {}, wanted))
           and (not q or q in str(n.get("id", "")).lower()
                or any(q in str(v).lower() for v in (n.get("labels") or {}).values()))]
    return sorted(out, key=lambda n: str(n.get("id", "")))


def node_rejections(plan: Mapping[str, Any], node_ids: Iterable[str]) -> list[dict[str, Any]]:
    """Node by node, for one replica's dry-run decision: feasible with its score, or rejected
    with every field the scheduler gave (extra ones kept: the rendering shows what it knows
    and lists the rest). Nodes the decision did not evaluate are said to be so."""
    decision = plan.get("decision") or {}
    rejections = decision.get("rejections") or {}
    scores = {str(s.get("node_id")): s for s in decision.get("scores") or [] if isinstance(s, Mapping)}
    chosen = plan.get("node") or decision.get("node_id")
    rows = []
    for nid in sorted(set(node_ids) | set(rejections) | set(scores)):
        if nid in rejections:
            r = rejections[nid] if isinstance(rejections[nid], Mapping) else {"reason": str(rejections[nid])}
            rows.append({"node": nid, "verdict": "rejected", **r})
        elif nid in scores:
            rows.append({"node": nid, "verdict": "chosen" if nid == chosen else "feasible",
                         "score": scores[nid].get("total"), "breakdown": scores[nid].get("breakdown") or {}})
        elif int(decision.get("evaluated", 0) or 0) >= int(decision.get("total", 0) or 0):
            rows.append({"node": nid, "verdict": "feasible"})  # passed every filter, not among the top scores
        else:
            rows.append({"node": nid, "verdict": "not evaluated"})  # sampling stopped before it
    return rows
