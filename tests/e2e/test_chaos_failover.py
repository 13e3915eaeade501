"""Failover: kill -9 the active scheduler replica in the middle of a burst of applies."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path

import pytest

from persys.scheduler.mirror import keys
from persys.store import open_store
from tests.e2e.harness import Components, active_replica, eventually
from tests.fixtures_infra import start_etcd

pytestmark = pytest.mark.e2e
BURST = 1000


def burst_manifests() -> str:
    # desiredState Stopped: each one is placed and delivered, but no process is started,
    # so a thousand of them stay cheap on a small machine.
    return "\n---\n".join(
        f"""apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: b{i:04d}}}
spec:
  type: process
  desiredState: Stopped
  resources: {{cpuMillicores: 10, memoryMb: 1}}
  process: {{command: ["sleep", "3600"]}}"""
        for i in range(BURST)
    )


async def placements(store_url: str) -> tuple[dict[str, list[str]], int]:
    store = open_store(store_url)
    try:
        assigned, _ = await store.range(keys.ASSIGNMENTS)
        workloads, _ = await store.range(keys.WORKLOADS)
    finally:
        await store.close()
    where: dict[str, list[str]] = {}
    for kv in assigned:
        node, inst = keys.parse_assignment(kv.key)
        where.setdefault(inst, []).append(node)
    return where, len(workloads)


def test_kill_active_scheduler_during_a_burst(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    c = Components(tmp_path, etcd.url, nodes=("n1", "n2"), replicas=2,
                   agent_args=("--cpu-millicores", "64000", "--memory-mb", "64000"))
    try:
        active = eventually(lambda: active_replica(c), 10, "an active replica")[0]
        victim = c.schedulers[int(str(active["replicaId"])[1:])]
        survivor = c.schedulers[1 - int(str(active["replicaId"])[1:])]
        manifests = tmp_path / "burst.yaml"
        manifests.write_text(burst_manifests())

        result: dict[str, object] = {}

        def apply() -> None:
            result["proc"] = c.ctl("apply", "-f", str(manifests), check=False)

        t = threading.Thread(target=apply)
        t.start()
        # Kill the active replica once the burst is well under way.
        eventually(lambda: asyncio.run(placements(etcd.url))[1] >= BURST // 4, 60, "a quarter applied")
        victim.stop(signal.SIGKILL)
        killed_at = time.time()
        t.join(300)
        proc = result["proc"]
        assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]

        h, _ = eventually(lambda: active_replica(c), 10, "standby took over")
        assert h["replicaId"] != active["replicaId"]
        takeover = float(h["electedAt"]) - killed_at  # type: ignore[arg-type]
        print(f"failover: new active replica elected {takeover:.2f}s after kill -9")

        def all_placed() -> tuple[dict[str, list[str]], int] | None:
            where, count = asyncio.run(placements(etcd.url))
            return (where, count) if len(where) >= BURST else None

        (where, count), _ = eventually(all_placed, 60, "every workload placed")
        print(f"all {BURST} placed {time.time() - killed_at:.1f}s after the kill")
        assert count == BURST, "no workload lost"
        doubles = {i: n for i, n in where.items() if len(n) != 1}
        assert not doubles, f"placed more than once: {list(doubles.items())[:5]}"
        assert set(where) == {f"b{i:04d}" for i in range(BURST)}
        assert survivor.alive()
        (tmp_path / "failover.json").write_text(json.dumps({"takeover_seconds": takeover}))
    finally:
        c.stop()
        etcd.stop()
