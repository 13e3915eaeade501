"""The node guard as a real process (persys.agent.node_guard_proc) over real workload processes:
it kills the guarded instances once the agent's lease has lapsed past its bound, never while
the lease is renewed, and records what it killed for the next agent."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from persys.agent import node_guard as ng
from persys.agent.guard_keeper import GuardKeeper, fence_entries
from persys.agent.runtimes.base import ObservedWorkload, RuntimeState
from tests.docker_fixtures import DockerEngine
from tests.e2e.harness import pid_alive


@pytest.mark.parametrize(("renewed", "bound", "now", "expect"), [
    (100.0, 10.0, 105.0, False),
    (100.0, 10.0, 110.0, False),  # exactly the bound: not yet
    (100.0, 10.0, 110.1, True),
    (100.0, 2.0, 102.5, True),
])
def test_due(renewed: float, bound: float, now: float, expect: bool) -> None:
    assert ng.due(ng.Lease(renewed, bound), now) is expect
    assert not ng.due(None, 1e12)  # no agent ever ran here: nothing to guard


@pytest.fixture
def workload() -> Iterator[subprocess.Popen[bytes]]:
    """A workload process leading its own group, as the process runtime starts them."""
    p = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    yield p
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(5)


def _guard(folder: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "persys.agent.node_guard_proc", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _observed(p: subprocess.Popen[bytes]) -> ObservedWorkload:
    return ObservedWorkload("w", "r1", 1, RuntimeState.RUNNING, str(p.pid))


def test_guard_kills_guarded_instances_once_the_lease_lapses(tmp_path: Path,
                                                             workload: subprocess.Popen[bytes]) -> None:
    folder = tmp_path / "guard"
    keeper = GuardKeeper(folder, lambda: 1.5, lambda fired: None, spawn=False)
    keeper.renew()
    keeper.guard(fence_entries([("w", "process", _observed(workload)),
                                ("kept", "process", ObservedWorkload("kept", "r", 1, RuntimeState.STOPPED, "1"))]))
    assert [e["instance"] for e in ng.read_fence(folder)] == ["w"]  # only running instances are guarded
    guard = _guard(folder)
    try:
        # Renewed well within the bound for 3 s: nothing is killed (an agent that is merely slow).
        until = time.monotonic() + 3
        while time.monotonic() < until:
            keeper.renew()
            stopped_renewing = time.monotonic()
            time.sleep(0.5)
            assert workload.poll() is None, "killed while the lease was renewed"
        workload.wait(1.5 + ng.POLL_EVERY + ng.KILL_WITHIN + 2)
        took = time.monotonic() - stopped_renewing
        assert took >= 1.5, f"killed {took:.1f}s after the last renewal, before the bound"
        assert workload.returncode == -signal.SIGKILL
        guard.wait(10)  # done: it exits, the next agent starts another
        fired: dict[str, float] = {}
        GuardKeeper(folder, lambda: 1.5, fired.update, spawn=False).renew()  # the next agent
        assert list(fired) == ["w"]
        assert ng.read_fired(folder) == {}  # consumed
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait(5)


def test_guard_never_kills_a_recycled_pid(tmp_path: Path, workload: subprocess.Popen[bytes]) -> None:
    folder = tmp_path / "guard"
    (entry,) = fence_entries([("w", "process", _observed(workload))])
    entry["startTicks"] += 1  # the pid now belongs to another process than the one guarded
    folder.mkdir()
    ng.write_fence(folder, [entry])
    ng.write_lease(folder, ng.Lease(ng.now() - 60, 1.0))
    guard = _guard(folder)
    try:
        guard.wait(10)
        assert workload.poll() is None and pid_alive(workload.pid)
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait(5)


def test_one_guard_per_folder(tmp_path: Path) -> None:
    folder = tmp_path / "guard"
    folder.mkdir()
    ng.write_lease(folder, ng.Lease(ng.now(), 60.0))
    first = _guard(folder)
    try:
        deadline = time.monotonic() + 10
        while not ng.guard_running(folder):
            assert time.monotonic() < deadline, "the guard never took its lock"
            time.sleep(0.05)
        second = _guard(folder)
        assert second.wait(10) == 0  # another guard watches this folder: it leaves at once
        assert first.poll() is None
    finally:
        first.kill()
        first.wait(5)


@pytest.mark.docker
def test_guard_stops_a_container_and_no_restart_policy_brings_it_back(tmp_path: Path,
                                                                        docker_engine: DockerEngine) -> None:
    """A container of a dead agent: the guard stops it as a manual stop, so even a Compose
    file's `restart: always` does not start it again."""
    name = docker_engine.workload_id("guarded")
    labels = [a for k, v in docker_engine.labels.items() for a in ("--label", f"{k}={v}")]
    cid = subprocess.run(["docker", "run", "-d", "--restart", "always", "--name", name, *labels, docker_engine.image,
                          "sleep", "300"], capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    folder = tmp_path / "guard"
    folder.mkdir()
    (entry,) = fence_entries([("guarded", "container", ObservedWorkload("guarded", "r", 1, RuntimeState.RUNNING, cid))])
    ng.write_fence(folder, [entry])
    ng.write_lease(folder, ng.Lease(ng.now() - 60, 1.0))  # the agent died a minute ago
    guard = _guard(folder)
    try:
        guard.wait(30)

        def running() -> str:
            return subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", cid], capture_output=True,
                                  text=True, timeout=30).stdout.strip()

        assert running() == "false"
        time.sleep(2)  # a restart policy would have started it again by now
        assert running() == "false", "the restart policy brought the container back"
        assert "guarded" in ng.read_fired(folder)
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait(5)
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60)
