"""How many nodes each shard member owns (the health document's `shards`, the dashboard's overview)."""

from __future__ import annotations

from persys.scheduler.decide.shards import SpreadCache, owner, spread


def test_spread_counts_each_members_nodes() -> None:
    nodes = [f"n{i}" for i in range(300)]
    members = ("r0", "r1", "r2")
    counts = spread(nodes, members)
    assert set(counts) == set(members) and sum(counts.values()) == 300
    assert counts == {m: sum(1 for n in nodes if owner(n, members) == m) for m in members}
    assert all(c > 50 for c in counts.values())  # rendezvous hashing spreads them
    assert spread(nodes, ()) == {}
    assert spread([], ("r0",)) == {"r0": 0}


def test_spread_cache_recounts_when_the_map_or_the_nodes_change() -> None:
    cache = SpreadCache(ttl=5.0)
    nodes = ["a", "b", "c"]
    first = cache.get(nodes, 3, ("r0",), 7, now=0.0)
    assert first == {"r0": 3}
    assert cache.get(["a"], 3, ("r0",), 7, now=1.0) is first  # same map and count, within the ttl
    assert cache.get([*nodes, "d"], 4, ("r0",), 7, now=1.0) == {"r0": 4}  # a node came
    assert sum(cache.get(nodes, 3, ("r0", "r1"), 8, now=1.0).values()) == 3  # the map changed
    assert cache.get(["a"], 3, ("r0", "r1"), 8, now=10.0) in ({"r0": 1, "r1": 0}, {"r0": 0, "r1": 1})  # expired
