"""Chaos: a scheduler restart while nodes died, and agents that come back late (issue #31). A
restarted scheduler placed new workloads on nodes that died while it was down (still Ready in
the store), and an agent back a few seconds after the node grace lost every workload. Now
nodes are judged on what this replica heard since it became active, with a restart grace
(--restart-grace, six node graces by default): unheard nodes get no new work and lose none.

Hollow agents (bench/scale/hollow.py) in four groups of three nodes: alive throughout, dead
(killed with the scheduler down, never back), back 15 s and back 30 s after the restart. Real
etcd and scheduler processes; the store is sampled every 250 ms."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from persys.client import SchedulerClient
from persys.tlsfiles import TLSFiles
from tests.e2e.harness import SCHEDULER_PORT, Proc, eventually, persys
from tests.e2e.test_chaos_liveness_load import REPO, StoreSampler, manifest
from tests.fixtures_infra import start_etcd

pytestmark = pytest.mark.e2e
GROUPS = {"alive": 0, "dead": 3, "back15": 6, "back30": 9}  # hollow node offsets, three nodes each
RETURNS = {"back15": float(os.environ.get("PERSYS_CHAOS_RETURN_EARLY", "15")),
           "back30": float(os.environ.get("PERSYS_CHAOS_RETURN_LATE", "30"))}


def node_ids(group: str) -> set[str]:
    return {f"hollow-{GROUPS[group] + i:05d}" for i in range(3)}


def test_restart_places_nothing_on_unheard_nodes_and_late_agents_keep_their_work(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    pki = tmp_path / "pki"
    subprocess.run(persys("certs", "init", "--dir", str(pki)), check=True, capture_output=True, timeout=120)
    tls = TLSFiles(pki / "ca.crt", pki / "admin.crt", pki / "admin.key")
    procs: list[Proc] = []
    sampler = StoreSampler(etcd.url)
    sched = Proc("scheduler", persys(
        "scheduler", "--listen", "127.0.0.1:0", "--store", etcd.url, "--tls-dir", str(pki), "--data-dir",
        str(tmp_path / "scheduler"), "--node-simulator", "user:admin"), tmp_path)
    procs.append(sched)
    target = f"127.0.0.1:{sched.bound_port(SCHEDULER_PORT)}"  # the restart takes the same port

    def call(fn: Any) -> Any:
        async def run() -> Any:
            client = SchedulerClient(target, tls, timeout=10)
            try:
                return await fn(client)
            finally:
                await client.close()
        return asyncio.run(run())

    def hollow(group: str) -> Proc:
        p = Proc(f"hollow-{group}", [
            sys.executable, str(REPO / "bench/scale/hollow.py"), "--scheduler", target, "--tls-dir", str(pki),
            "--cert", "admin", "--nodes", "3", "--offset", str(GROUPS[group]), "--channels", "1",
            "--heartbeat-interval", "3", "--report-interval", "10", "--control", str(tmp_path / f"{group}.sock")],
            tmp_path)
        procs.append(p)
        return p

    def placements() -> dict[str, str]:
        return {w["id"]: w.get("node", "") for w in call(lambda c: c.list_workloads())}

    try:
        hollows = {g: hollow(g) for g in GROUPS}
        eventually(lambda: sum(n.get("status") == "Ready" for n in call(lambda c: c.list_nodes())) == 12, 90,
                   "12 hollow nodes Ready")
        call(lambda c: c.apply_many([manifest(f"w{i}") for i in range(24)]))
        def all_placed() -> dict[str, str] | None:
            p = placements()
            return p if sum(bool(n) for n in p.values()) == 24 else None

        before, _ = eventually(all_placed, 60, "24 workloads placed")
        late = {w: n for w, n in before.items() if n in node_ids("back15") | node_ids("back30")}
        assert late, f"nothing landed on the late nodes: {before}"
        sampler.start()

        sched.stop()  # the scheduler goes down; meanwhile three groups of agents die
        for g in ("dead", "back15", "back30"):
            os.kill(hollows[g].pid, signal.SIGKILL)
            hollows[g].proc.wait(10)  # type: ignore[union-attr]
        sched.start()
        sched.wait_for("scheduler ready", 60)
        restarted = time.monotonic()
        call(lambda c: c.apply_many([manifest(f"new{i}") for i in range(6)]))
        for g in ("back15", "back30"):
            time.sleep(max(0.0, restarted + RETURNS[g] - time.monotonic()))
            hollows[g].start()
        eventually(lambda: all(n.get("status") == "Ready" for n in call(lambda c: c.list_nodes())
                               if n["id"] in node_ids("back30")), 30, "the late nodes registered again")
        time.sleep(4)  # a few heartbeats and reports after their return
        after = placements()
        nodes = {n["id"]: n for n in call(lambda c: c.list_nodes())}
    finally:
        sampler.stopping.set()
        for p in reversed(procs):
            p.stop()
        etcd.stop()
    sampler.join(10)
    seen = sampler.seen
    new = {w: n for w, n in after.items() if w.startswith("new")}
    print(f"restart: {seen.samples} store samples; late nodes' instances {late}; new ones {new}")
    new_nodes = {after[f"new{i}"] for i in range(6)}
    assert not new_nodes & (node_ids("dead") | node_ids("back15") | node_ids("back30")), \
        f"placed on nodes not heard from since the restart: {new_nodes}"
    assert all(after[w] == n for w, n in late.items()), f"late agents lost work: {late} -> {after}"
    assert seen.moved == {} and not seen.relocating, f"instances moved: {seen.moved} {sorted(seen.relocating)}"
    assert not set(seen.not_ready) & (node_ids("back15") | node_ids("back30")), seen.not_ready
    assert all(nodes[n]["status"] == "Ready" for n in node_ids("dead")), "dead nodes judged within the restart grace"
