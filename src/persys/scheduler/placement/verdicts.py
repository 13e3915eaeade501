"""Static-filter verdicts kept as bit sets over the nodes, and the rejections of one decision.

A static filter's verdict on a node depends only on the node's static facts (readiness, cordon,
runtimes, taints, labels) and on the part of the request named by the filter's ``static_key``,
so it is computed once per node set and key and memoised. A verdict is held as groups of nodes
rejected with one shared Status, each group a Python int used as a bit set over the nodes in id
order (bit i is the i-th node). Combining a request's static filters, counting the rejections in
the range a decision walked and updating one changed node are then a few big-integer
operations, not a Python step per node: at 5,000 nodes a decision used to spend more time
copying and aggregating the rejections it walked past than deciding.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .framework import Filter, PlacementContext
from .nodebits import NodeBits, bits_of, positions
from .snapshot import NodeInfo, WorkloadRequest
from .status import Status, fmt_amount


class FilterVerdicts:
    """One static filter's verdict on every node under one static key: Status -> nodes.

    A filter may compute its verdict for all nodes at once with
    ``static_groups(request, nodes: NodeBits) -> dict[Status, int] | None`` (the label filters do, from
    the label index); otherwise it is asked node by node. A changed node is always re-asked with
    ``check``, so both forms must agree (a property test holds them to it)."""

    __slots__ = ("filter", "groups", "request")

    def __init__(self, filter_: Filter, request: WorkloadRequest, order: Sequence[NodeInfo],
                 ctx: PlacementContext) -> None:
        self.filter = filter_
        self.request = request  # any request with this static key: what refresh() checks against
        self.groups: dict[Status, int] = {}
        bulk = filter_.static_groups(request, NodeBits(order, ctx.snapshot.static.caches))
        if bulk is not None:
            self.groups = {status: bits for status, bits in bulk.items() if bits}
            return
        found: dict[Status, list[int]] = {}
        check = filter_.check
        for i, node in enumerate(order):
            status = check(node, request, ctx)
            if status is not None:
                members = found.get(status)
                if members is None:
                    found[status] = [i]
                else:
                    members.append(i)
        n = len(order)
        self.groups = {s: bits_of(members, n) for s, members in found.items()}

    def refresh(self, i: int, node: NodeInfo, ctx: PlacementContext) -> None:
        bit = 1 << i
        for status, bits in list(self.groups.items()):
            if bits & bit:
                if bits == bit:
                    del self.groups[status]
                else:
                    self.groups[status] = bits ^ bit
        now = self.filter.check(node, self.request, ctx)
        if now is not None:
            self.groups[now] = self.groups.get(now, 0) | bit


class ShapeVerdicts:
    """A request shape's static filters, in chain order, combined: each node's first static
    rejection (as groups of (filter position, Status, nodes)) and the nodes passing them all."""

    __slots__ = ("_passing", "_rows", "filters", "groups", "n", "passing_bits", "stale")

    def __init__(self, filters: Sequence[FilterVerdicts], n: int) -> None:
        self.filters = tuple(filters)
        self.n = n
        self.groups: list[tuple[int, Status, int]] = []
        self.passing_bits = 0
        self._passing: list[int] | None = None
        self._rows: list[tuple[int, Status] | None] | None = None
        self.stale = True
        self.combine()

    def combine(self) -> None:
        remaining = (1 << self.n) - 1
        groups: list[tuple[int, Status, int]] = []
        for k, verdict in enumerate(self.filters):
            rejected = 0
            for status, bits in verdict.groups.items():
                first = bits & remaining
                if first:
                    groups.append((k, status, first))
                    rejected |= first
            remaining &= ~rejected
        self.groups, self.passing_bits = groups, remaining
        self._passing = self._rows = None
        self.stale = False

    def passing(self) -> list[int]:
        """Positions passing every static filter, ascending."""
        if self.stale:
            self.combine()
        if self._passing is None:
            self._passing = positions(self.passing_bits)
        return self._passing

    def rows(self) -> list[tuple[int, Status] | None]:
        """Per node: None, or (position of its first rejecting static filter, that Status)."""
        if self.stale:
            self.combine()
        if self._rows is None:
            rows: list[tuple[int, Status] | None] = [None] * self.n
            for k, status, bits in self.groups:
                row = (k, status)
                for i in positions(bits):
                    rows[i] = row
            self._rows = rows
        return self._rows

    def within(self, mask: int) -> tuple[tuple[Status, int], ...]:
        """The static rejections among the nodes in ``mask``: (Status, nodes) groups."""
        if self.stale:
            self.combine()
        return tuple((status, bits & mask) for _, status, bits in self.groups if bits & mask)


def summarise(counted: Iterable[tuple[Status, int]]) -> str:
    """Kubernetes-style summary from (Status, number of nodes) pairs: ``30 insufficient memory
    (needs ..., best node has ... free), 12 ...``. Grouped by (code, reason) so different taints
    stay separate; sorted by count descending, then text."""
    groups: dict[tuple[str, str], list[Any]] = {}  # (code, reason) -> [count, first, best available]
    for st, count in counted:
        g = groups.get((st.code, st.reason))
        if g is None:
            groups[(st.code, st.reason)] = [count, st, st.available]
        else:
            g[0] += count
            if st.available is not None and (g[2] is None or st.available > g[2]):
                g[2] = st.available
    parts: list[tuple[int, str]] = []
    for (_, reason), (count, first, best) in groups.items():
        text = reason
        if first.needed is not None:
            text += (
                f" (needs {fmt_amount(first.needed, first.unit)}, "
                f"best node has {fmt_amount(max(best, 0), first.unit)} free)"
            )
        parts.append((count, text))
    parts.sort(key=lambda p: (-p[0], p[1]))
    return ", ".join(f"{n} {text}" for n, text in parts)


class Rejections(Mapping[str, Status]):
    """The nodes one decision rejected, node id -> Status.

    Nodes rejected by a dynamic filter are held one by one; nodes rejected by a static filter
    stay bit-set groups until someone asks for them by node (``plan``, ``explain --node``), so a
    decision that walks past thousands of statically rejected nodes neither copies nor counts
    them one at a time, and its summary costs a population count per group.
    """

    __slots__ = ("_each", "_expanded", "_groups", "_order")

    def __init__(self, each: dict[str, Status], groups: Sequence[tuple[Status, int]] = (),
                 order: Sequence[NodeInfo] = ()) -> None:
        self._each = each
        self._groups = tuple(groups)
        self._order = order
        self._expanded: dict[str, Status] | None = None if self._groups else each

    def _all(self) -> dict[str, Status]:
        if self._expanded is None:
            expanded = dict(self._each)
            order = self._order
            for status, bits in self._groups:
                for i in positions(bits):
                    expanded[order[i].id] = status
            self._expanded = expanded
        return self._expanded

    def __getitem__(self, node_id: str) -> Status:
        return self._all()[node_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._each) + sum(bits.bit_count() for _, bits in self._groups)

    def __repr__(self) -> str:
        return f"Rejections({self._all()!r})"

    def one_by_one(self) -> Mapping[str, Status]:
        """The nodes rejected one at a time (by a dynamic filter, or every node of a node-by-node
        walk), without expanding the static groups."""
        return self._each

    def code_counts(self) -> dict[str, int]:
        """Nodes rejected per status code (a population count per group): for metrics."""
        out: dict[str, int] = {}
        for status, bits in self._groups:
            out[status.code] = out.get(status.code, 0) + bits.bit_count()
        for status in self._each.values():
            out[status.code] = out.get(status.code, 0) + 1
        return out

    def sample(self, per_group: int, limit: int) -> list[str]:
        """Up to `limit` rejected node ids, in id order, at most `per_group` of each distinct
        first reason, so every reason of the summary has nodes to show in detail: taken from the
        bit-set groups without expanding them."""
        chosen: set[str] = set()
        taken: dict[str, int] = {}  # by reason text: a str caches its hash, a Status does not
        for node_id, status in self._each.items():
            k = taken.get(status.reason, 0)
            if k < per_group:
                taken[status.reason] = k + 1
                chosen.add(node_id)
        order = self._order
        for _, bits in self._groups:
            rest = bits
            for _ in range(per_group):
                if not rest:
                    break
                low = rest & -rest
                chosen.add(order[low.bit_length() - 1].id)
                rest ^= low
        return sorted(chosen)[:limit]  # ids sort as the nodes' positions do

    def summary(self) -> str:
        counted: list[tuple[Status, int]] = [(s, bits.bit_count()) for s, bits in self._groups]
        counted.extend((s, 1) for s in self._each.values())
        return summarise(counted)
