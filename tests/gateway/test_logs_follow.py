"""`persysctl logs -f / --since / --timestamps` and `persysctl apply --wait` against real parts: a
scheduler, an agent (process runtime and the real Docker engine) and a gateway, each its own OS
process, persysctl as a subprocess.

- `apply --wait` exits 0 once a runnable workload runs; 1 at once, naming InvalidSpec, for a
  command that does not exist; 1 at its --timeout, naming Pending and the placement's reason, for a
  request no node fits.
- `logs -f` (process, then container) prints lines written after it started, and ends by itself
  (exit 0, the reason on stderr) when the workload is deleted.
- `--since` keeps only the newer lines of a container; for a process it is refused in one line.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker_fixtures import DockerEngine, remove_containers
from tests.e2e.harness import ctl, eventually
from tests.gateway.cluster import GatewayCluster, ready_cluster
from tests.gateway.test_live_streams import Reader

pytestmark = [pytest.mark.e2e]

TICKER = 'i=0; while true; do echo "tick $i"; i=$((i+1)); sleep 0.2; done'


def _process(name: str, command: list[str], cpu: int = 50) -> str:
    return (f"apiVersion: persys.dev/v1\nkind: Workload\nmetadata: {{name: {name}}}\nspec:\n  type: process\n"
            f"  resources: {{cpuMillicores: {cpu}, memoryMb: 16}}\n  process: {{command: {command}}}\n")


def _container(name: str, image: str) -> str:
    return (f"apiVersion: persys.dev/v1\nkind: Workload\nmetadata: {{name: {name}}}\nspec:\n  type: container\n"
            f"  resources: {{cpuMillicores: 50, memoryMb: 32}}\n"
            f"  container: {{image: '{image}', command: ['sh', '-c', '{TICKER}']}}\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    with ready_cluster(tmp_path_factory.mktemp("logs")) as c:
        yield c


def _apply(c: GatewayCluster, tmp: Path, manifest: str, *extra: str) -> subprocess.CompletedProcess[str]:
    f = tmp / f"{uuid.uuid4().hex[:8]}.yaml"
    f.write_text(manifest)
    return ctl("apply", "-f", str(f), *extra, env=c.ctl_env(), check=False)


def _ticks(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.search(r"tick (\d+)$", line))]


def _follow_until_deleted(c: GatewayCluster, name: str) -> None:
    env = c.ctl_env()
    # Ticks printed before the follow starts are history; --tail 0 shows only what comes after.
    before = max(_ticks(ctl("logs", name, "--tail", "5", env=env).stdout.splitlines()) or [-1])
    reader = Reader(["logs", "-f", "--tail", "0", name], env)
    try:
        eventually(lambda: len(_ticks(reader.lines)) >= 3, 30, f"{name}: three new lines while following")
        ticks = _ticks(reader.lines)
        assert ticks[0] > before and ticks == list(range(ticks[0], ticks[0] + len(ticks))), ticks
        ctl("delete", "workload", name, env=env)
        assert reader.p.wait(timeout=30) == 0  # ended by itself: the instance is gone
        assert reader.p.stderr is not None
        assert "is gone" in reader.p.stderr.read()
    finally:
        if reader.p.poll() is None:
            reader.interrupt()


def test_apply_wait_returns_once_running_and_logs_follow_ends_on_delete(cluster: GatewayCluster,
                                                                       tmp_path: Path) -> None:
    name = f"tick-{uuid.uuid4().hex[:6]}"
    r = _apply(cluster, tmp_path, _process(name, ["/bin/sh", "-c", TICKER]), "--wait", "--timeout", "60")
    assert r.returncode == 0, r.stderr
    assert f"workload/{name} created" in r.stdout and f"workload/{name}: Running, 1/1 ready" in r.stderr
    _follow_until_deleted(cluster, name)


def test_since_and_timestamps_for_a_process(cluster: GatewayCluster, tmp_path: Path) -> None:
    """A process's output has no time per line; the agent notes when it appeared (every second),
    and --since/--timestamps are answered from that: never earlier than the line was written."""
    import datetime as dt

    name = f"two-{uuid.uuid4().hex[:6]}"
    script = "echo early; sleep 8; echo late; sleep 600"
    assert _apply(cluster, tmp_path, _process(name, ["/bin/sh", "-c", script]), "--wait").returncode == 0
    env = cluster.ctl_env()
    try:
        eventually(lambda: "early" in ctl("logs", name, env=env).stdout, timeout=30, what="early")
        time.sleep(1.5)  # past the agent's next note of the file's growth (one a second)
        now = dt.datetime.now(dt.UTC)
        between = now.isoformat().replace("+00:00", "Z")
        eventually(lambda: "late" in ctl("logs", name, env=env).stdout, timeout=30, what="late")
        r = ctl("logs", name, "--since", between, "--timestamps", env=env)
        assert "early" not in r.stdout and re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z late\n", r.stdout), r.stdout
        stamped = ctl("logs", name, "--timestamps", env=env).stdout.splitlines()
        assert [line.split(" ", 1)[1] for line in stamped][-2:] == ["early", "late"], stamped
        seen = [dt.datetime.fromisoformat(line[:26] + "+00:00") for line in stamped[-2:]]  # to microseconds
        assert seen[0] < now < seen[1]
    finally:
        ctl("delete", "workload", name, env=env, check=False)


def test_apply_wait_names_why_a_workload_does_not_run(cluster: GatewayCluster, tmp_path: Path) -> None:
    bad, big = f"nocmd-{uuid.uuid4().hex[:6]}", f"huge-{uuid.uuid4().hex[:6]}"
    try:
        t0 = time.monotonic()
        r = _apply(cluster, tmp_path, _process(bad, ["/no/such/command"]), "--wait", "--timeout", "60")
        assert r.returncode == 1 and time.monotonic() - t0 < 45, r.stderr  # terminal: no need to wait it out
        assert f"workload/{bad} failed:" in r.stderr and "InvalidSpec" in r.stderr, r.stderr
        r = _apply(cluster, tmp_path, _process(big, ["sleep", "600"], cpu=10_000_000), "--wait", "--timeout", "4")
        assert r.returncode == 1, r.stderr
        assert re.search(rf"workload/{big} not running after 4s: Pending \(\w+\)", r.stderr), r.stderr
    finally:
        for n in (bad, big):
            ctl("delete", "workload", n, env=cluster.ctl_env(), check=False)


def test_apply_wait_does_not_take_a_crash_loop_for_running(cluster: GatewayCluster, tmp_path: Path) -> None:
    """A process that exits 1 after a moment is Running between its restarts: --wait exits 1 at
    its deadline, saying it restarted (it used to print Running and exit 0)."""
    name = f"crashy-{uuid.uuid4().hex[:6]}"
    try:
        r = _apply(cluster, tmp_path, _process(name, ["/bin/sh", "-c", "sleep 0.3; exit 1"]), "--wait",
                   "--timeout", "12")
        assert r.returncode == 1, r.stderr
        assert f"workload/{name} not running after 12s" in r.stderr and "restarted" in r.stderr, r.stderr
    finally:
        ctl("delete", "workload", name, env=cluster.ctl_env(), check=False)


@pytest.mark.docker
def test_container_logs_since_timestamps_and_follow(cluster: GatewayCluster, docker_engine: DockerEngine,
                                                    tmp_path: Path) -> None:
    name, env = docker_engine.workload_id("ticker"), cluster.ctl_env()
    try:
        r = _apply(cluster, tmp_path, _container(name, docker_engine.image), "--wait", "--timeout", "90")
        assert r.returncode == 0, r.stderr
        eventually(lambda: len(_ticks(ctl("logs", name, env=env).stdout.splitlines())) >= 15, 30, "3 s of ticks")
        everything = _ticks(ctl("logs", name, "--since", "1h", "--tail", "0", env=env).stdout.splitlines())
        assert everything[0] == 0
        recent = _ticks(ctl("logs", name, "--since", "1s", "--tail", "0", env=env).stdout.splitlines())
        assert recent and 0 not in recent and len(recent) < len(everything), (recent, everything)
        stamped = ctl("logs", name, "--tail", "2", "--timestamps", env=env).stdout.splitlines()
        assert len(stamped) == 2 and all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z tick \d+$", s)
                                         for s in stamped), stamped
        _follow_until_deleted(cluster, name)
    finally:
        ctl("delete", "workload", name, env=env, check=False)
        remove_containers(f"persys.workload={name}")  # whatever a failed test left
