"""Group commit: many small compare-and-swap units in few transactions, on SQLite and real etcd."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from persys.scheduler.interpret.group_commit import TXN_MAX_OPS, GroupCommit, Unit, commit_units, pack
from persys.store import open_store
from persys.store.base import Compare, Put, StateStore
from tests.cases import load


@pytest.fixture
async def store(store_url: str) -> StateStore:  # type: ignore[misc]
    s = open_store(store_url)
    yield s
    await s.close()


def create(key: str, value: bytes = b"v") -> Unit:
    return Unit([Compare(key, 0)], [Put(key, value)])


def test_pack_counts_compares_and_operations_per_branch() -> None:
    wide = Unit([Compare("/w", 0)] * 125, [Put(f"/w/{i}", b"") for i in range(125)])
    assert [len(t) for t in pack([create("/x"), wide, create("/y")])] == [2, 1]


PACK_CASES = load(__file__, "group_commit_cases/pack.yaml")


@pytest.mark.parametrize("case", PACK_CASES, ids=[c["name"] for c in PACK_CASES])
def test_pack_case(case: dict[str, Any]) -> None:
    units = [create(u.get("key", f"/k/{n}"), b"v" * u.get("value_bytes", 1))
             for n, u in enumerate(u for spec in case["units"] for u in [spec] * spec["count"])]
    txns = pack(units)
    assert [len(t) for t in txns] == case["expect"]
    assert [u for t in txns for u in t] == units  # order kept


async def test_units_are_committed_within_the_request_limit(store: StateStore) -> None:
    """Twenty 200 KB units land (in several transactions); a unit over the limit is refused
    alone, before anything is sent, and the others land."""
    rev0 = await store.current_revision()
    units = [create(f"/big/{i:02d}", b"x" * 200_000) for i in range(20)]
    assert await commit_units(lambda c, o: _ok(store, c, o), units) == [True] * 20  # type: ignore[arg-type]
    assert await store.current_revision() - rev0 == len(pack(units)) == 3
    mixed = [create("/big/a"), create("/big/huge", b"x" * 2_000_000), create("/big/b")]
    assert await commit_units(lambda c, o: _ok(store, c, o), mixed) == [True, False, True]  # type: ignore[arg-type]
    assert await store.get("/big/huge") is None
    gc = GroupCommit(lambda c, o: _ok(store, c, o))  # type: ignore[arg-type]
    assert await gc.submit([(u.compares, u.ops) for u in [create("/big/c"), create("/big/huge2", b"x" * 2_000_000)]]
                           ) == [True, False]


async def test_commit_units_lands_the_others_when_one_guard_fails(store: StateStore) -> None:
    await store.txn([], [Put("/k/taken", b"first")])
    rev0 = await store.current_revision()
    units = [create(f"/k/{i}") for i in range(10)] + [create("/k/taken", b"second")]
    oks = await commit_units(lambda c, o: _ok(store, c, o), units)  # type: ignore[arg-type]
    assert oks == [True] * 10 + [False]
    kv = await store.get("/k/taken")
    assert kv is not None and kv.value == b"first"
    kvs, _ = await store.range("/k/")
    assert len(kvs) == 11
    # one failed joint attempt, then one transaction per unit
    assert await store.current_revision() - rev0 == 10


async def _ok(store: StateStore, compares: list[Compare], ops: list[Put]) -> bool:  # type: ignore[type-arg]
    return await store.txn(compares, ops) is not None


async def test_group_commit_joins_concurrent_submitters(store: StateStore) -> None:
    gc = GroupCommit(lambda c, o: _ok(store, c, o), max_in_flight=2)  # type: ignore[arg-type]
    rev0 = await store.current_revision()
    results = await asyncio.gather(*(gc.submit([([Compare(f"/g/{i}", 0)], [Put(f"/g/{i}", b"x")])])
                                     for i in range(500)))
    assert results == [[True]] * 500
    kvs, _ = await store.range("/g/")
    assert len(kvs) == 500
    txns = await store.current_revision() - rev0
    assert txns <= 500 / (TXN_MAX_OPS // 4), f"{txns} transactions for 500 concurrent units"
    # a lost race is reported to its submitter only
    again = await asyncio.gather(gc.submit([([Compare("/g/1", 0)], [Put("/g/1", b"y")])]),
                                 gc.submit([([Compare("/g/new", 0)], [Put("/g/new", b"y")])]))
    assert again == [[False], [True]]
    store_error = GroupCommit(_broken)
    with pytest.raises(RuntimeError, match="store down"):
        await store_error.submit([([], [Put("/z", b"")])])


async def _broken(compares: object, ops: object) -> bool:
    raise RuntimeError("store down")
