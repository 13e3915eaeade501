"""How the suite runs on several pytest-xdist workers (`scripts/test.sh` runs `-n 2 --dist loadgroup`).

Most of the suite waits (processes starting, grace periods, leases, guests booting) rather than
computes, so two workers on two cores finish it in much less wall time. What must not be split:

- a module's tests stay together on one worker: its module-scoped fixtures (a gateway cluster, a
  registry, a `persys dev`) are then started once, as without xdist;
- tests sharing a one-per-machine service form one group across modules: nfs-ganesha (two would
  fight over the portmapper registration, tests/nfs_server.py) and the one-node Ceph cluster (a
  session fixture: one start, ~1 min, instead of one per worker);
- SERIAL modules measure behaviour under a load they make themselves (a CPU hog, a storm of
  connections, ten processes starting) or hold liveness bounds shortened for speed: they run
  after the parallel part, alone (`-m serial`), so that their bounds are not shared with another
  worker's processes.

Every test binds port 0 or retries on a collision, names what it creates per cluster or per test,
and keeps its files under its own tmp_path: workers do not otherwise see each other.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# One-per-machine services: every test using one of these fixtures runs in that group.
MACHINE_GROUPS = {
    "nfs_server": "host-storage",
    "ceph_cluster": "host-storage",
}

# Modules that make their own load and time what happens under it (run last, alone).
SERIAL = frozenset({
    "e2e/test_chaos_liveness_load.py",  # 20 hollow agents + a CPU hog + a Redis outage
    "e2e/test_chaos_shards.py",  # 10 processes starting at once must spread within a bound
    "gateway/test_shedding.py",  # 1,000 concurrent connections against one gateway
    # Liveness bounds shortened to keep them quick (a 5 s grace for seven agents, a node guard's
    # lease, agents returning at 15 s and 30 s): a second worker's processes would eat into them.
    "e2e/test_chaos_liveness.py",
    "e2e/test_chaos_node_guard.py",
    "e2e/test_chaos_restart_grace.py",
})


def is_worker() -> bool:
    """True in an xdist worker (the controller and a plain run are not workers)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def _module(item: pytest.Item) -> str:
    path = Path(str(item.path)).resolve()
    return path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else path.as_posix()


def group_of(item: pytest.Item) -> str:
    fixtures = set(getattr(item, "fixturenames", ()))
    for fixture, group in MACHINE_GROUPS.items():
        if fixture in fixtures:
            return group
    return _module(item)


def mark_groups(items: list[pytest.Item]) -> None:
    for item in items:
        if _module(item) in SERIAL:
            item.add_marker(pytest.mark.serial)
        item.add_marker(pytest.mark.xdist_group(group_of(item)))
