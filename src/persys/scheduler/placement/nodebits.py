"""Node sets as bit sets: bit i is the i-th node in id order (the snapshot's static order).

The shared vocabulary of static verdicts (verdicts.py) and of the filters that answer for every
node at once (`Filter.static_groups`): kept apart from both so the plugin protocol can name
`NodeBits` without importing the verdict machinery that calls the plugins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .snapshot import NodeInfo
from .status import Status

_BYTE_POSITIONS = tuple(tuple(j for j in range(8) if b >> j & 1) for b in range(256))


def positions(bits: int) -> list[int]:
    """Indices of the set bits, ascending (a byte at a time: sparse and dense sets are cheap)."""
    out: list[int] = []
    if bits <= 0:
        return out
    for k, byte in enumerate(bits.to_bytes((bits.bit_length() + 7) // 8, "little")):
        if byte:
            base = 8 * k
            out.extend([base + j for j in _BYTE_POSITIONS[byte]])
    return out


def bits_of(indices: Iterable[int], n: int) -> int:
    """The bit set with exactly these indices (< n) set, built in O(n) rather than O(n^2/64)."""
    buf = bytearray((n + 7) // 8)
    for i in indices:
        buf[i >> 3] |= 1 << (i & 7)
    return int.from_bytes(buf, "little")


def range_bits(start: int, last: int, n: int) -> int:
    """Positions start..last inclusive, wrapping past n - 1 to 0 when last < start."""
    between = ((1 << (last + 1)) - 1) ^ ((1 << start) - 1)
    return between if start <= last else ((1 << n) - 1) ^ between


class LabelBits:
    """The nodes carrying each value of one label key (None: nodes without the key)."""

    __slots__ = ("by_value", "key")

    def __init__(self, key: str, order: Sequence[NodeInfo]) -> None:
        self.key = key
        found: dict[str | None, list[int]] = {}
        for i, node in enumerate(order):
            found.setdefault(node.labels.get(key), []).append(i)
        n = len(order)
        self.by_value: dict[str | None, int] = {v: bits_of(members, n) for v, members in found.items()}

    def refresh(self, i: int, node: NodeInfo) -> None:
        bit = 1 << i
        for value, bits in list(self.by_value.items()):
            if bits & bit:
                self.by_value[value] = bits ^ bit
        value = node.labels.get(self.key)
        self.by_value[value] = self.by_value.get(value, 0) | bit


class NodeBits:
    """What a filter's ``static_groups`` sees: the node count and, per label key, which
    nodes carry which value (built on first use and memoised with the verdicts)."""

    __slots__ = ("_cache", "_order", "all", "n")

    def __init__(self, order: Sequence[NodeInfo], cache: dict[Any, Any]) -> None:
        self._order = order
        self._cache = cache
        self.n = len(order)
        self.all = (1 << self.n) - 1

    def label(self, key: str) -> dict[str | None, int]:
        hit = self._cache.get(("label_bits", key))
        if hit is None:
            hit = self._cache[("label_bits", key)] = LabelBits(key, self._order)
        index: LabelBits = hit
        return index.by_value

    def first_unmet(self, checks: Iterable[tuple[Status, int]]) -> dict[Status, int]:
        """Each node's first failed check, for checks given in order as (the Status of failing
        it, the nodes meeting it): Status -> the nodes for which that check is the first unmet."""
        groups: dict[Status, int] = {}
        remaining = self.all
        for status, meeting in checks:
            failing = remaining & ~meeting
            if failing:
                groups[status] = failing
                remaining &= meeting
        return groups

    def matching(self, key: str, accepts: Callable[[str | None], bool]) -> int:
        """The nodes whose value of ``key`` (None when absent) ``accepts`` says yes to."""
        found = 0
        for value, bits in self.label(key).items():
            if accepts(value):
                found |= bits
        return found
