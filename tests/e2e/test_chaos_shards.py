"""Sharded mode: three active replicas share the nodes; kill one and its nodes move to the others,
which keep converging. Real etcd, schedulers, agents and gateway; workloads are host processes."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.harness import Components, eventually, pid_alive, process_manifest, replica_healths
from tests.fixtures_infra import start_etcd

pytestmark = pytest.mark.e2e
NODES = ("n1", "n2", "n3", "n4", "n5", "n6")


def all_running(c: Components, names: list[str]) -> dict[str, dict] | None:  # type: ignore[type-arg]
    views = {w["name"]: w for w in json.loads(c.ctl("get", "workloads", "-o", "json").stdout)}
    return views if all(n in views and views[n]["phase"] == "Running" for n in names) else None


def test_kill_one_of_three_sharded_replicas(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    c = Components(tmp_path, etcd.url, nodes=NODES, replicas=3, scheduler_args=("--sharded",),
                   agent_args=("--cpu-millicores", "8000"))
    try:
        def spread() -> dict[int, dict] | None:  # type: ignore[type-arg]
            h = replica_healths(c)
            owned = sum(x["ownedNodes"] for x in h.values())
            return h if len(h) == 3 and owned == len(NODES) and sum(1 for x in h.values() if x["ownedNodes"]) >= 2 \
                else None

        h, _ = eventually(spread, 60, "nodes spread over the replicas")  # 10 processes start on 2 busy cores
        print("owned before:", {i: x["ownedNodes"] for i, x in h.items()})
        names = [f"s{i}" for i in range(12)]
        c.ctl("apply", "-f", "-", stdin="\n---\n".join(process_manifest(n) for n in names))
        before, _ = eventually(lambda: all_running(c, names), 30, "all Running")
        assert {w["node"] for w in before.values()} == set(NODES), "placed across every node"

        victim = max((i for i in h if not h[i]["active"]), key=lambda i: h[i]["ownedNodes"])
        moved = h[victim]["ownedNodes"]
        assert moved > 0
        c.schedulers[victim].stop(signal.SIGKILL)
        killed = time.monotonic()

        def handed_over() -> dict[int, dict] | None:  # type: ignore[type-arg]
            now = replica_healths(c)
            return now if len(now) == 2 and sum(x["ownedNodes"] for x in now.values()) == len(NODES) else None

        after, took = eventually(handed_over, 45, "the victim's nodes owned by the others")
        print(f"{moved} nodes handed over {took:.1f}s after kill -9:", {i: x["ownedNodes"] for i, x in after.items()})
        # Nothing restarted, and every node keeps converging: new work lands everywhere.
        time.sleep(3)
        same = all_running(c, names)
        assert same is not None
        assert all(same[n]["runtimeId"] == before[n]["runtimeId"] for n in names)
        assert all(pid_alive(int(w["runtimeId"])) for w in same.values())
        nodes = json.loads(c.ctl("get", "nodes", "-o", "json").stdout)
        assert all(n["status"] == "Ready" for n in nodes), [(n["id"], n["status"]) for n in nodes]
        more = [f"t{i}" for i in range(12)]
        c.ctl("apply", "-f", "-", stdin="\n---\n".join(process_manifest(n) for n in more))
        final, _ = eventually(lambda: all_running(c, more), 30, "new work Running after the handoff")
        assert {w["node"] for w in final.values()} == set(NODES)
        print(f"converging again {time.monotonic() - killed:.1f}s after the kill")
        c.ctl("delete", "-f", "-", stdin="\n---\n".join(process_manifest(n) for n in names + more))
    finally:
        c.stop()
        etcd.stop()
