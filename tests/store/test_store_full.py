"""A full disk under the embedded store, for real (a 1 MiB tmpfs filled by a file): writes fail as
StoreFull naming the disk (they surfaced as gRPC's "Unexpected <class StoreError>"), the status says
so, the mode guard turns degraded with that reason (health said normal), and a write after space is
freed clears it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from persys.scheduler.ha.mode_guard import Mode, ModeGuard
from persys.scheduler.mirror import keys
from persys.store.base import Compare, Put, StoreFull
from persys.store.sqlite import SqliteStore
from tests.small_disk import fill


def test_a_full_disk_is_named_and_degrades_the_mode(small_disk: Path) -> None:
    async def run() -> None:
        store = SqliteStore(small_disk / "state.db")
        changes: list[tuple[Mode, Mode, str]] = []
        guard = ModeGuard(store, None, lambda old, new, why: changes.append((old, new, why)), lambda: 0)
        try:
            await store.put(keys.CLUSTER, b'{"id": "c1"}')
            await guard.check()
            assert guard.mode == Mode.NORMAL
            filler = fill(small_disk)
            with pytest.raises(StoreFull, match="is full"):
                for i in range(200):  # the page cache may take a few before the disk refuses
                    await store.txn([Compare(f"/k/{i}", 0)], [Put(f"/k/{i}", os.urandom(8192))])
            assert "is full" in str((await store.status())["full"])
            await guard.check()
            assert guard.mode == Mode.DEGRADED and guard.reason.startswith("state store full: the disk holding")
            filler.unlink()
            await store.put("/k/after", b"room again")
            assert "full" not in await store.status()
            await guard.check()
            assert guard.mode == Mode.NORMAL
        finally:
            await store.close()

    asyncio.run(run())
