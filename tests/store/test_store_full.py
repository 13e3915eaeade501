"""A full disk under the embedded store, for real (a 1 MiB tmpfs filled by a file): writes fail as
StoreFull naming the disk (they surfaced as gRPC's "Unexpected <class StoreError>"), the status says
so, the mode guard turns degraded with that reason (health said normal), and a write after space is
freed clears it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from persys.scheduler import keys
from persys.scheduler.mode_guard import Mode, ModeGuard
from persys.store.base import Compare, Put, StoreFull
from persys.store.sqlite import SqliteStore


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True, capture_output=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False, capture_output=True)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):  # ENOSPC: full
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_is_named_and_degrades_the_mode(small_disk: Path) -> None:
    async def run() -> None:
        store = SqliteStore(small_disk / "state.db")
        changes: list[tuple[Mode, Mode, str]] = []
        guard = ModeGuard(store, None, lambda old, new, why: changes.append((old, new, why)), lambda: 0)
        try:
            await store.put(keys.CLUSTER, b'{"id": "c1"}')
            await guard.check()
            assert guard.mode == Mode.NORMAL
            filler = _fill(small_disk)
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
