"""A pool folder for the `local` driver that leaves nothing behind: at teardown (also when a test
failed) every mount under it is unmounted and every loop device backed by a file under it is
freed, then the folder is removed. The machine has eight loop devices, shared with other runs."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from persys.storage import node_mounts as nm

__all__ = ["loop_pool", "sweep_pool"]


def sweep_pool(pool: Path) -> list[str]:
    """Unmount and free what lives under `pool`; returns what was left (for the failure message)."""
    left = []
    prefix = str(pool) + "/"
    mounts = nm.parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    for m in reversed(mounts):  # stacked and nested mounts: the newest first
        if m.mount_point.startswith(prefix):
            left.append(f"mount {m.mount_point}")
            subprocess.run(["umount", "-l", m.mount_point], capture_output=True, timeout=30)
    for loop in nm.loop_devices(30):
        if loop.back_file.startswith(prefix):
            left.append(f"loop {loop.name} -> {loop.back_file}")
            subprocess.run(["losetup", "-d", loop.name], capture_output=True, timeout=30)
    shutil.rmtree(pool, ignore_errors=True)
    return left


@pytest.fixture
def loop_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    pool = tmp_path_factory.mktemp("pool")
    yield pool
    left = sweep_pool(pool)
    assert not left, f"the test left these behind (now removed): {left}"


def cluster_pool(pool: Path, ca: Path) -> Path:
    """Where a node of the cluster whose CA is `ca` keeps its local volumes under `pool`
    (storage.local: `<pool>/cluster-<id>/`, so two clusters sharing a pool never meet)."""
    from persys.security.cluster_id import cluster_id_of_file

    return pool / f"cluster-{cluster_id_of_file(ca)}"
