"""Chaos: a killed (kill -9) or frozen (SIGSTOP) agent must never leave a second live copy of an
`onDisconnect: Stop` workload once the scheduler starts it on another node (issue #31: 29 s of
two copies after a kill -9, 50 s after a 60 s SIGSTOP). The node guard (persys.agent.node_guard)
kills the copy when the agent's lease lapses, and the scheduler relocates only after that
bound; an agent that is merely slow within the bound keeps its copy. Real etcd, scheduler, two
agents and their guards as OS processes; copies are sampled every 100 ms."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.harness import stop_node_guards
from tests.e2e.test_chaos_disconnect import Cluster, copy_pid, manifest
from tests.fixtures_infra import start_etcd

pytestmark = pytest.mark.e2e
SAMPLE_EVERY = 0.1


def watch_copies(c: Cluster, name: str, until: str, within: float) -> list[tuple[float, int]]:
    """Sample the live copies of `name` on both nodes every 100 ms until it runs on `until`
    (as the scheduler says) with a single copy there; returns the samples with two copies."""
    doubles: list[tuple[float, int]] = []
    start = time.monotonic()
    last_ask = 0.0
    where = ("", "")
    while time.monotonic() - start < within:
        live = [pid for d in c.dirs.values() if (pid := copy_pid(d, name)) is not None]
        if len(live) > 1:
            doubles.append((round(time.monotonic() - start, 1), len(live)))
        if time.monotonic() - last_ask > 1.0:
            last_ask = time.monotonic()
            try:
                where = c.where(name)
            except Exception:  # a busy scheduler: ask again at the next second
                where = ("", "")
        if where == ("Running", until) and copy_pid(c.dirs[until], name) is not None and len(live) == 1:
            return doubles
        time.sleep(SAMPLE_EVERY)
    raise AssertionError(f"{name} not Running on {until} within {within}s (last: {where}); two copies in "
                         f"{len(doubles)} samples, from {doubles[:1]} to {doubles[-1:]}")


def test_killed_or_frozen_agent_never_leaves_two_copies(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    cluster: Cluster | None = None
    try:
        cluster = c = Cluster(tmp_path, etcd.url)
        agent_a = c.agent("a", c.target)  # alone at first: the workload lands there
        c.call(lambda s: s.apply(manifest("solo", onDisconnect="Stop")))
        deadline = time.monotonic() + 30
        while c.where("solo") != ("Running", "a") or copy_pid(c.dirs["a"], "solo") is None:
            assert time.monotonic() < deadline, "solo not Running on a"
            time.sleep(0.2)
        first = copy_pid(c.dirs["a"], "solo")

        # Slow within the bound (frozen 2 s, the bound is the node grace, 5 s): nothing is killed.
        os.kill(agent_a.pid, signal.SIGSTOP)
        time.sleep(2)
        os.kill(agent_a.pid, signal.SIGCONT)
        c.agent("b", c.target)
        time.sleep(6)  # past the bound: a guard that fired on the pause would have killed it by now
        assert copy_pid(c.dirs["a"], "solo") == first, "the guard killed the copy of an agent paused for 2 s"

        # kill -9: the agent cannot stop anything; its guard does, before the copy starts on b.
        os.kill(agent_a.pid, signal.SIGKILL)
        agent_a.proc.wait(10)  # type: ignore[union-attr]
        doubles = watch_copies(c, "solo", "b", 60)
        assert doubles == [], f"two live copies after kill -9 in {len(doubles)} samples, from {doubles[0]}"
        assert copy_pid(c.dirs["a"], "solo") is None

        # SIGSTOP for longer than the bound: the guard kills b's copy, the scheduler moves it to a.
        c.agent("a", c.target)
        agent_b = next(p for p in reversed(c.procs) if p.name == "agent-b")
        os.kill(agent_b.pid, signal.SIGSTOP)
        try:
            doubles = watch_copies(c, "solo", "a", 60)
            assert doubles == [], f"two live copies after SIGSTOP in {len(doubles)} samples, from {doubles[0]}"
        finally:
            os.kill(agent_b.pid, signal.SIGCONT)
        # Thawed, b learns it was disconnected and must not start its copy again on its own.
        until = time.monotonic() + 8
        while time.monotonic() < until:
            live = [d.name for d in c.dirs.values() if copy_pid(d, "solo") is not None]
            assert live == ["agent-a"], f"copies after b thawed: {live}"
            time.sleep(SAMPLE_EVERY)
    finally:
        if cluster is not None:
            cluster.stop()
        stop_node_guards(tmp_path)
        etcd.stop()
