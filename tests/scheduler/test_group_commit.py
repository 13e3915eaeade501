"""Group commit: many small compare-and-swap units in few transactions, on SQLite and real etcd."""

from __future__ import annotations

import asyncio

import pytest

from persys.scheduler.group_commit import TXN_MAX_OPS, GroupCommit, Unit, commit_units, pack
from persys.store import open_store
from persys.store.base import Compare, Put, StateStore


@pytest.fixture
async def store(store_url: str) -> StateStore:  # type: ignore[misc]
    s = open_store(store_url)
    yield s
    await s.close()


def create(key: str, value: bytes = b"v") -> Unit:
    return Unit([Compare(key, 0)], [Put(key, value)])


def test_pack_respects_op_limits_and_never_writes_a_key_twice() -> None:
    units = [create(f"/k/{i}") for i in range(300)]
    txns = pack(units)
    assert [len(t) for t in txns] == [126, 126, 48]  # 128 minus room for the leader fence
    assert [u for t in txns for u in t] == units  # order kept
    twice = pack([create("/a"), create("/b"), create("/a"), create("/c")])
    assert [[u.ops[0].key for u in t] for t in twice] == [["/a", "/b"], ["/a", "/c"]]
    wide = Unit([Compare("/w", 0)] * 125, [Put(f"/w/{i}", b"") for i in range(125)])
    assert [len(t) for t in pack([create("/x"), wide, create("/y")])] == [2, 1]


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
