"""The store wrapper over the real embedded store (SQLite): every call counted by operation and
result, a lost compare-and-swap an answer (`ok`), a refused write an error; capabilities the
backend has (or lacks) still seen through the wrapper."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from persys.observability.metrics import Metrics
from persys.store.base import BlockingLeases, Put, StateStore, TxnTooLarge
from persys.store.metered import MeteredStore
from persys.store.sqlite import SqliteStore


def test_operations_counted_by_result(tmp_path: Path) -> None:
    async def run() -> None:
        m = Metrics(process=False)
        inner = SqliteStore(tmp_path / "state.db")
        store = MeteredStore(inner, m)
        assert isinstance(store, StateStore)
        assert isinstance(store, BlockingLeases) == isinstance(inner, BlockingLeases)
        try:
            rev = await store.put("/k", b"v")
            assert await store.cas("/k", b"w", rev) is not None
            assert await store.cas("/k", b"x", rev) is None  # lost: an answer, not an error
            assert (await store.get("/k")).value == b"w"  # type: ignore[union-attr]
            with pytest.raises(TxnTooLarge):
                await store.txn([], [Put("/big", b"x" * (store.max_txn_bytes + 1))])
        finally:
            await store.close()
        ops = m.counter("persys_store_operations_total")
        assert ops.values == {("put", "ok"): 1, ("cas", "ok"): 2, ("get", "ok"): 1, ("txn", "error"): 1}
        seconds = m.histogram("persys_store_operation_duration_seconds")
        assert seconds.count(("cas",)) == 2 and seconds.count(("txn",)) == 1
        text = m.exposition().decode()
        assert 'persys_store_operations_total{operation="txn",result="error"} 1' in text

    asyncio.run(run())
