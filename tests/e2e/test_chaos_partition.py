"""A frozen (SIGSTOP) or cut-off (no etcd) active replica: its agents move to the new active
within seconds, the old one steps down once it runs again, and no workload restarts or moves."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.harness import (
    Components,
    active_replica,
    delete_workloads,
    eventually,
    instance_snapshot,
    process_manifest,
    replica_healths,
)
from tests.fixtures_infra import start_etcd
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.e2e
NODES = ("n1", "n2")
WORKLOADS = 3  # of 2 replicas each: 6 supervised processes over 2 nodes
OUTAGE = 14.0  # longer than the lease TTL (2 s) and the node grace period (10 s) from the election


@contextmanager
def watching_nodes(store_url: str) -> Iterator[list[str]]:
    """Polls node statuses in the background; yields the list of NotReady sightings."""
    seen: list[str] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.3):
            try:
                _, nodes = instance_snapshot(store_url)
            except Exception:  # etcd busy for a moment: look again
                continue
            seen.extend(f"{n}: {s}" for n, s in nodes.items() if s != "Ready")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join(10)


def registered_with(c: Components, node: str, target: str, since: int) -> bool:
    return f"registered node {node} with {target}" in c.agents[node].text()[since:]


def run_outage(tmp_path: Path, fault: Callable[[Components, int, dict[int, TcpProxy]], Callable[[], None]]) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    proxies = {i: TcpProxy(etcd.url.removeprefix("etcd://").split(",")[0]) for i in range(2)}
    c = Components(tmp_path, etcd.url, nodes=NODES, replicas=2,
                   replica_store_urls=tuple(f"etcd://{proxies[i].address}" for i in range(2)))
    try:
        for k in range(WORKLOADS):
            c.ctl("apply", "-f", "-", stdin=process_manifest(f"w{k}", cpu=50, replicas=2))

        def all_running() -> dict[str, tuple[str, str, str, int]] | None:
            inst, nodes = instance_snapshot(etcd.url)
            ok = (len(inst) == 2 * WORKLOADS and all(p == "Running" and rid for p, _, rid, _ in inst.values())
                  and all(s == "Ready" for s in nodes.values()))
            return inst if ok else None

        before, _ = eventually(all_running, 60, "every instance Running")
        active = eventually(lambda: active_replica(c), 10, "an active replica")[0]
        old = int(str(active["replicaId"])[1:])
        new_target = c.replica_targets[1 - old]
        marks = {n: len(c.agents[n].text()) for n in NODES}

        with watching_nodes(etcd.url) as not_ready:
            t0 = time.time()
            undo = fault(c, old, proxies)
            try:
                h, _ = eventually(lambda: (lambda h: h if h and h["active"] else None)(
                    replica_healths(c).get(1 - old)), 15, "the standby elected")
                elected = float(h["electedAt"])
                eventually(lambda: all(registered_with(c, n, new_target, marks[n]) for n in NODES), 10,
                           "every agent registered with the new active replica")
                moved = time.time()
                print(f"new active elected {elected - t0:.2f}s after the fault; agents on it "
                      f"{moved - elected:.2f}s after its election")
                time.sleep(max(0.0, t0 + OUTAGE - time.time()))
            finally:
                undo()
            # Running again, the old replica notices it lost the lead and says so.
            eventually(lambda: replica_healths(c).get(old, {}).get("active") is False, 15,
                       "the old active replica steps down")
            after, _ = eventually(all_running, 15, "every instance Running after the outage")
        assert not not_ready, f"nodes went NotReady: {sorted(set(not_ready))}"
        assert after == before, "an instance restarted or moved: " + str(
            {i: (before.get(i), after.get(i)) for i in set(before) | set(after) if before.get(i) != after.get(i)})
        assert replica_healths(c)[1 - old]["active"], "the new active replica stays active"
        # The agents are fully served by the new active replica: new work reaches them, and a
        # deletion completes (the agents remove the processes and report it).
        c.ctl("apply", "-f", "-", stdin=process_manifest("later", cpu=50, replicas=2))
        eventually(lambda: sum(1 for i, v in instance_snapshot(etcd.url)[0].items()
                               if i.startswith("later") and v[0] == "Running") == 2, 30, "new work Running")
        for k in range(WORKLOADS):
            c.ctl("delete", "workload", f"w{k}")
    finally:
        try:
            delete_workloads(c, etcd.url)
        finally:
            c.stop()
        for p in proxies.values():
            p.close()
        etcd.stop()


def test_frozen_active_replica_hands_its_agents_over(tmp_path: Path) -> None:
    def freeze(c: Components, old: int, _: dict[int, TcpProxy]) -> Callable[[], None]:
        proc = c.schedulers[old].proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        return lambda: proc.send_signal(signal.SIGCONT)

    run_outage(tmp_path, freeze)


def test_active_replica_cut_from_etcd_hands_its_agents_over(tmp_path: Path) -> None:
    def cut(c: Components, old: int, proxies: dict[int, TcpProxy]) -> Callable[[], None]:
        proxies[old].cut()
        return proxies[old].heal

    run_outage(tmp_path, cut)
