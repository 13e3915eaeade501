"""Shared fixtures: real etcd/Redis servers and the Docker engine (started on demand)."""

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bao_server import *  # noqa: F403
from tests.ceph_cluster import ceph_cluster  # noqa: F401 - the one-node Ceph cluster, started on first use
from tests.docker_fixtures import *  # noqa: F403
from tests.e2e.harness import stop_leftover_procs, stop_node_guards
from tests.fixtures_infra import *  # noqa: F403
from tests.fixtures_infra import stop_leftover_servers
from tests.fixtures_secure_infra import *  # noqa: F403
from tests.lanes import mark_unit_tests
from tests.parallel import is_worker, mark_groups
from tests.registry_server import *  # noqa: F403
from tests.small_disk import small_disk  # noqa: F401  (a fixture: a real 1 MiB disk to fill)


@pytest.hookimpl(tryfirst=True)
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--strict-skips", action="store_true",
                     help="fail the run on a skip not declared in tests/allowed_skips.txt (.ci/run uses it)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--strict-skips"):
        from tests.skip_guard import SkipGuard

        config.pluginmanager.register(SkipGuard(), "persys-skip-guard")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_unit_tests(items)  # the fast lane's selection (tests/lanes.py)
    mark_groups(items)  # what must share a worker, what runs alone (tests/parallel.py)


def _agent_cgroups() -> set[Path]:
    """The per-agent cgroup folders under every controller's `persys/` (cgroup v1 and v2)."""
    parents = [p for p in Path("/sys/fs/cgroup").glob("*/persys") if p.is_dir()]
    parents += [p for p in [Path("/sys/fs/cgroup/persys")] if p.is_dir()]
    return {d for parent in parents for d in parent.iterdir() if d.is_dir()}


@pytest.fixture(autouse=True, scope="session")
def _stop_leftover_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Servers and components a failed start or an interrupted test left running are stopped at
    the end of the run, and named, so that a leak shows instead of outliving the run. Agents'
    node guards outlive their agent by design (until its lease lapses): they are stopped too."""
    yield
    stop_node_guards(tmp_path_factory.getbasetemp())
    left = stop_leftover_procs() + stop_leftover_servers()
    if left:
        print(f"\nstopped {len(left)} process(es) left running by tests: {', '.join(sorted(left))}", file=sys.stderr)


_CGROUPS_BEFORE = pytest.StashKey[set[Path]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not is_worker():  # the controller (or a plain run): workers' agents are still running at a worker's end
        session.config.stash[_CGROUPS_BEFORE] = _agent_cgroups()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Agents leave their cgroup folder behind on purpose (workloads outlive the agent); the
    suite removes the empty ones its agents made, deepest first, so runs do not pile them up."""
    before = session.config.stash.get(_CGROUPS_BEFORE, None)
    if before is None:
        return
    for top in sorted(_agent_cgroups() - before):
        deepest_first = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for d in [*deepest_first, top]:
            with contextlib.suppress(OSError):  # not empty: something still runs there
                d.rmdir()
