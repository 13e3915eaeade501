"""A standby whose watch is cut off while etcd compacts the history it missed, then failover.

Real etcd, two scheduler processes, one agent running host processes. The standby reaches
etcd through a TCP link the test cuts (a partition of that replica alone); while it is cut
off, workloads are created and deleted and etcd is compacted past the standby's revision.
When the link is back the standby must notice the compaction, reload, and say so in its
health; after a kill -9 of the active replica it takes over knowing every workload, and the
agent removes nothing that should run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from persys.store import open_store
from tests.e2e.harness import Components, active_replica, eventually, pid_alive, process_manifest, replica_healths
from tests.fixtures_infra import start_etcd
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.e2e

KEPT, DELETED, ADDED = 10, 4, 8  # small: every instance is a real process on a 2-core machine


def running_pids(c: Components, names: list[str]) -> dict[str, int] | None:
    views = {w["name"]: w for w in json.loads(c.ctl("get", "workloads", "-o", "json").stdout)}
    if not all(n in views and views[n]["phase"] == "Running" and views[n]["runtimeId"] for n in names):
        return None
    return {n: int(views[n]["runtimeId"]) for n in names}


def store_revision(url: str) -> int:
    async def read() -> int:
        store = open_store(url)
        try:
            return await store.current_revision()
        finally:
            await store.close()

    return asyncio.run(read())


def test_standby_that_missed_a_compaction_recovers_and_takes_over_without_removing_anything(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    links = [TcpProxy(etcd.endpoint) for _ in range(2)]  # each replica's own way to etcd
    c = Components(tmp_path, etcd.url, nodes=("n1",), replicas=2,
                   replica_store_urls=tuple(f"etcd://{link.address}" for link in links),
                   agent_args=("--cpu-millicores", "64000", "--memory-mb", "64000"))
    try:
        active = eventually(lambda: active_replica(c), 10, "an active replica")[0]
        a = int(str(active["replicaId"])[1:])
        b = 1 - a  # the standby, whose link the test cuts
        link = links[b]
        first = [f"cwk{i:02d}" for i in range(KEPT + DELETED)]
        (tmp_path / "first.yaml").write_text("\n---\n".join(process_manifest(n, cpu=10) for n in first))
        c.ctl("apply", "-f", str(tmp_path / "first.yaml"))
        eventually(lambda: running_pids(c, first), 60, "first workloads running")

        link.reset()  # the standby's watch breaks and cannot resume
        deleted, kept = first[:DELETED], first[DELETED:]
        added = [f"cwa{i:02d}" for i in range(ADDED)]
        (tmp_path / "added.yaml").write_text("\n---\n".join(process_manifest(n, cpu=10) for n in added))
        c.ctl("apply", "-f", str(tmp_path / "added.yaml"))
        for n in deleted:
            c.ctl("delete", "workload", n)  # waits until the agent removed it
        wanted = kept + added
        pids, _ = eventually(lambda: running_pids(c, wanted), 60, "added workloads running")
        etcd.etcdctl("compact", str(store_revision(etcd.url)))  # history the standby missed is gone
        link.heal()

        seen: list[dict] = []  # type: ignore[type-arg]  # the standby's last health, for a failure's message

        def recovered() -> dict | None:  # type: ignore[type-arg]
            h = replica_healths(c).get(b)
            if h is None:
                return None
            seen[:] = [h]
            m = h["mirror"]
            # Its role is not asked: on a loaded machine the active may lose its lease meanwhile
            # (keep-alive past its deadline) and the recovered standby take over already. Nor is
            # a lag of exactly 0: the active keeps writing (reports, audit), so a loaded standby
            # is a few revisions behind at most instants; "healthy" means it keeps up (mirror_health).
            ok = (m["compactionRecoveries"] >= 1 and m["watch"] == "healthy"
                  and h["mode"] == "normal" and h["workloads"] == len(wanted))
            return h if ok else None

        try:
            standby, took = eventually(recovered, 30, "the standby recovered from the compaction")
        except AssertionError as err:
            raise AssertionError(f"{err}; its last health: {seen[:1]}") from None
        print(f"standby recovered {took:.1f}s after the link was restored: mirror {standby['mirror']}")

        agent_log = len(c.agents["n1"].text())  # the deletes above were legitimately removed
        c.schedulers[a].stop(signal.SIGKILL)  # (if b took over already, this kills a standby)
        new, _ = eventually(lambda: (h := active_replica(c)) and h["replicaId"] == f"r{b}" and h, 20,
                            "the former standby active")
        assert new["workloads"] == len(wanted), new  # it knows every workload

        # The agent reconciles with the new active replica: a workload applied now runs there ...
        (tmp_path / "after.yaml").write_text(process_manifest("cwafter", cpu=10))
        c.ctl("apply", "-f", str(tmp_path / "after.yaml"))
        eventually(lambda: running_pids(c, ["cwafter"]), 60, "a workload applied after the failover running")
        # ... and nothing that should run was removed or restarted on the way.
        assert all(pid_alive(pid) for pid in pids.values()), {n: p for n, p in pids.items() if not pid_alive(p)}
        assert "no longer desired" not in c.agents["n1"].text()[agent_log:]
        now = running_pids(c, wanted)
        assert now == pids, "every workload still runs as the same process"
        names = {w["name"] for w in json.loads(c.ctl("get", "workloads", "-o", "json").stdout)}
        assert names == {*wanted, "cwafter"}
    finally:
        c.stop()
        for link in links:
            link.close()
        etcd.stop()
        _end_processes(tmp_path)


def _end_processes(tmp_path: Path) -> None:
    """Stopping the agent leaves its processes running (the next agent adopts them): end them
    and remove their cgroups (rmdir only succeeds on an empty one)."""
    metas = [json.loads(m.read_text()) for m in tmp_path.glob("agent-*/runtimes/process/*/meta.json")]
    for meta in metas:
        if meta.get("pid") and pid_alive(meta["pid"]):
            os.kill(meta["pid"], signal.SIGKILL)
    for meta in metas:
        if meta.get("pid"):
            eventually(lambda pid=meta["pid"]: not pid_alive(pid), 10, "process gone")
        for cgroup in meta.get("cgroups", []):
            with contextlib.suppress(OSError):
                os.rmdir(cgroup)
