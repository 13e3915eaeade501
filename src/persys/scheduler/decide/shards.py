"""Sharding of node work across active-active scheduler replicas.

Every replica announces itself under `/persys/replicas/<id>` with a lease. The elected leader
records the live membership in the epoch key `/persys/shards`; every replica derives the same
owner for each node from that list by rendezvous hashing (the replica with the highest hash of
"<replica>/<node>" owns it), so a membership change moves only the nodes of the replica that
came or went. The owner of a node serves its agent (registration, heartbeats, reports, desired
state), judges its liveness and writes its workloads' statuses; each of those writes carries a
compare on the epoch key, so after a handoff a former owner's in-flight writes fail instead of
doubling the new owner's work, and the new owner redoes everything from the store.
Placement itself stays with the elected leader, which sees the whole cluster.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable


def score(replica: str, node: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{replica}/{node}".encode(), digest_size=8).digest(), "big")


def owner(node: str, members: Iterable[str]) -> str:
    """Rendezvous (highest random weight) hashing: stable, and minimal movement on change."""
    best, best_score = "", -1
    for m in members:
        s = score(m, node)
        if s > best_score or (s == best_score and m < best):
            best, best_score = m, s
    return best


def encode_members(members: Iterable[str]) -> bytes:
    return json.dumps({"members": sorted(members)}).encode()


def decode_members(value: bytes | None) -> tuple[str, ...]:
    if not value:
        return ()
    try:
        return tuple(sorted(json.loads(value).get("members", [])))
    except (ValueError, AttributeError):
        return ()


def spread(node_ids: Iterable[str], members: tuple[str, ...]) -> dict[str, int]:
    """How many of the nodes each member owns (every member listed, 0 when it owns none)."""
    counts = dict.fromkeys(members, 0)
    if members:
        for n in node_ids:
            counts[owner(n, members)] += 1
    return counts


class SpreadCache:
    """`spread` for the health document, remembered while the shard map and the node count are
    the same and for at most `ttl` seconds: at 5,000 nodes and 3 members it is 15,000 hashes,
    and health is asked often (every dashboard overview, every probe)."""

    def __init__(self, ttl: float = 5.0) -> None:
        self.ttl = ttl
        self._key: tuple[tuple[str, ...], int, int] | None = None
        self._at = -1e18
        self._counts: dict[str, int] = {}

    def get(self, node_ids: Iterable[str], count: int, members: tuple[str, ...], rev: int, now: float
            ) -> dict[str, int]:
        key = (members, rev, count)
        if key != self._key or now - self._at > self.ttl:
            self._key, self._at, self._counts = key, now, spread(node_ids, members)
        return self._counts
