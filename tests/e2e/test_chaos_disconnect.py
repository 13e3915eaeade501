"""Chaos: an agent partitioned from its scheduler (the agent and its host keep running) must not
leave a second live copy of an `onDisconnect: Stop` workload once the scheduler starts it on
another node; `Keep` workloads run on. Real etcd, scheduler and two agents as OS processes; the
partition is a TCP proxy (tests/tcp_proxy.py) between one agent and the scheduler."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from persys.client import SchedulerClient
from persys.tlsfiles import TLSFiles
from tests.e2e.harness import Proc, eventually, persys, pid_alive
from tests.fixtures_infra import start_etcd
from tests.storage.loop_pool import sweep_pool
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.e2e
GRACE = 5.0  # the scheduler's node grace (default 10), shortened to keep the test quick
T = TypeVar("T")


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"type": "process", "resources": {"cpuMillicores": 100, "memoryMb": 16},
                     "process": {"command": ["sleep", "3600"]}, **spec}}


def copy_pid(state_dir: Path, instance: str) -> int | None:
    """The pid of a live copy of `instance` run by the agent with this state directory."""
    meta = state_dir / "runtimes" / "process" / instance / "meta.json"
    try:
        pid = json.loads(meta.read_text()).get("pid")
    except (OSError, ValueError):
        return None
    return pid if pid and pid_alive(pid) else None


class Cluster:
    """One scheduler (port 0) on `etcd_url` and agents "a" and "b" started on demand."""

    def __init__(self, tmp: Path, etcd_url: str) -> None:
        self.tmp, self.pki = tmp, tmp / "pki"
        subprocess.run(persys("certs", "init", "--dir", str(self.pki), "--node", "a", "--node", "b"), check=True,
                       capture_output=True, timeout=60)
        self.tls = TLSFiles(self.pki / "ca.crt", self.pki / "admin.crt", self.pki / "admin.key")
        self.dirs = {n: tmp / f"agent-{n}" for n in ("a", "b")}
        self.procs = [Proc("scheduler", persys(
            "scheduler", "--listen", "127.0.0.1:0", "--store", etcd_url, "--tls-dir", str(self.pki),
            "--data-dir", str(tmp / "sched"), "--node-grace", str(GRACE)), tmp)]
        self.procs[0].wait_for("scheduler ready", 60)
        m = re.search(r"scheduler ready on port (\d+)", self.procs[0].text())
        assert m, self.procs[0].text()
        self.port = int(m.group(1))
        self.target = f"127.0.0.1:{self.port}"

    def agent(self, node: str, target: str) -> Proc:
        storage = self.tmp / f"storage-{node}.yaml"  # a local volume pool: the pinned workload's volume
        storage.write_text(f"local: {{pool: {self.dirs[node] / 'volumes'}}}\n")
        p = Proc(f"agent-{node}", persys("agent", "--scheduler", target, "--node-id", node, "--tls-dir",
                                         str(self.pki), "--state-dir", str(self.dirs[node]),
                                         "--storage", str(storage)), self.tmp)
        self.procs.append(p)
        p.wait_for(f"agent {node} started", 60)
        return p

    def call(self, fn: Callable[[SchedulerClient], Awaitable[T]]) -> T:
        async def run() -> T:
            client = SchedulerClient(self.target, self.tls, timeout=5)
            try:
                return await fn(client)
            finally:
                await client.close()
        return asyncio.run(run())

    def where(self, name: str) -> tuple[str, str]:
        w = self.call(lambda c: c.get_workload(name))
        return w.get("phase", ""), w.get("node", "")

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        for meta in self.tmp.glob("agent-*/runtimes/process/*/meta.json"):
            pid = json.loads(meta.read_text()).get("pid")
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        for d in self.dirs.values():  # what the agents left mounted (a stopped agent keeps volumes)
            sweep_pool(d / "volumes")


def test_partitioned_agent_stops_single_writer_copies_before_they_start_elsewhere(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    cluster: Cluster | None = None
    proxy: TcpProxy | None = None
    try:
        cluster = c = Cluster(tmp_path, etcd.url)
        dirs, call, where, agent = c.dirs, c.call, c.where, c.agent
        proxy = TcpProxy(f"127.0.0.1:{c.port}")
        agent_a = agent("a", proxy.address)  # only "a" exists at first: everything lands there
        fenced, kept, pinned = "fenced", "kept", "pinned"
        for doc in (manifest(fenced, onDisconnect="Stop"), manifest(kept),
                    manifest(pinned, volumes=[{"name": "data", "mountPath": "/data"}])):  # local: Stop, pinned
            call(lambda c, doc=doc: c.apply(doc))  # type: ignore[misc]
        for name in (fenced, kept, pinned):
            eventually(lambda name=name: where(name) == ("Running", "a"), 30, f"{name} Running on a")  # type: ignore[misc]
        old = {name: copy_pid(dirs["a"], name) for name in (fenced, kept, pinned)}
        assert all(old.values()), old
        agent("b", c.target)
        eventually(lambda: call(lambda c: c.get_node("b")).get("status") == "Ready", 30, "node b Ready")

        proxy.cut()  # "a" and its host keep running; it can no longer reach any replica
        cut_at = time.monotonic()
        old_gone = new_up = 0.0
        deadline = cut_at + GRACE + 90  # generous: relocation waits on liveness, slow on a busy machine
        while not new_up:
            assert time.monotonic() < deadline, "the fenced workload never started on b"
            on_a, on_b = copy_pid(dirs["a"], fenced), copy_pid(dirs["b"], fenced)
            now = time.monotonic() - cut_at
            assert not (on_a and on_b), f"two live copies of {fenced} at {now:.2f}s after the cut (a {on_a}, b {on_b})"
            if not on_a and not old_gone:
                old_gone = now
            if on_b:
                new_up = now
            assert copy_pid(dirs["a"], kept) == old[kept], "a Keep workload stopped on the partitioned node"
            time.sleep(0.02)
        print(f"\nafter the cut (grace {GRACE}s): old copy stopped at {old_gone:.2f}s, "
              f"new copy running on b at {new_up:.2f}s, gap {new_up - old_gone:.2f}s")
        assert 0 < old_gone < new_up
        assert new_up <= GRACE + 15, "relocation took far longer than the grace"
        assert copy_pid(dirs["a"], pinned) is None, "the pinned Stop workload still runs on the partitioned node"
        assert copy_pid(dirs["a"], kept) == old[kept]
        assert "stopping fenced, pinned (onDisconnect: Stop)" in agent_a.text()

        proxy.heal()
        healed_at = time.monotonic()
        # The scheduler still wants the pinned one on a: it starts again; the moved one never does.
        while copy_pid(dirs["a"], pinned) is None:
            assert time.monotonic() - healed_at < 45, "the pinned workload was not started again after reconnection"
            assert copy_pid(dirs["a"], fenced) is None, "the relocated copy came back on the partitioned node"
            time.sleep(0.1)
        print(f"after healing: pinned workload running again on a after {time.monotonic() - healed_at:.2f}s")
        eventually(lambda: copy_pid(dirs["a"], kept) is None, 45, "stale Keep copy stopped after reconnection")
        eventually(lambda: where(pinned) == ("Running", "a"), 30, "pinned reported Running on a")
        # Both agents share this host's cgroup tree (/sys/fs/cgroup/*/persys/<instance>), so a's
        # removal of its stale copy also signals b's copy, which b then restarts: a one-host
        # artefact (issue #10, defect 8), not a second copy. The relocated copy stays on b.
        eventually(lambda: copy_pid(dirs["b"], fenced), 30, "the relocated copy running on b")
        eventually(lambda: where(fenced) == ("Running", "b"), 30, "fenced reported Running on b")
        assert copy_pid(dirs["a"], fenced) is None
        for name in (fenced, kept, pinned):
            call(lambda c, name=name: c.delete(name))  # type: ignore[misc]
    finally:
        if cluster is not None:
            cluster.stop()
        if proxy is not None:
            proxy.close()
        etcd.stop()


def test_store_outage_stops_single_writer_copies_and_they_resume(tmp_path: Path) -> None:
    """The store away: the lone replica loses its lease and answers agents as a standby, which is
    no acknowledgement (a standby cannot vouch that no other replica is active and relocating),
    so an onDisconnect: Stop instance stops: unavailable, never doubled. When the store is back
    and a replica active again, the scheduler still wants it on its node and it starts again."""
    etcd = start_etcd(tmp_path / "etcd")
    cluster: Cluster | None = None
    try:
        cluster = c = Cluster(tmp_path, etcd.url)
        agent_a = c.agent("a", c.target)
        c.call(lambda cl: cl.apply(manifest("single-writer", onDisconnect="Stop")))
        eventually(lambda: c.where("single-writer") == ("Running", "a"), 30, "Running on a")
        pid = copy_pid(c.dirs["a"], "single-writer")
        assert pid
        etcd.stop()
        eventually(lambda: copy_pid(c.dirs["a"], "single-writer") is None, 30, "stopped without a replica's ack")
        assert "onDisconnect: Stop" in agent_a.text()
        etcd.start()
        eventually(lambda: c.call(lambda cl: cl.health())["mode"] == "normal", 30, "normal again")
        again, _ = eventually(lambda: copy_pid(c.dirs["a"], "single-writer"), 60, "started again on a")
        assert again != pid
        assert c.where("single-writer") == ("Running", "a")
    finally:
        if cluster is not None:
            cluster.stop()
        etcd.stop()
