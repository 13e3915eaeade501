"""Chaos: a manifest the placement engine cannot evaluate, written straight into etcd (as an
older version or a restore would), among good ones; and the same manifest sent to the API.

Real etcd, scheduler, agent and gateway processes; workloads are real host processes."""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from persys.scheduler.mirror import keys
from persys.store import open_store
from tests.e2e.harness import Components, eventually, kill_process_workloads, process_manifest
from tests.fixtures_infra import EtcdServer, start_etcd

pytestmark = pytest.mark.e2e

BAD_CONSTRAINTS = [{"key": "cores", "operator": "Gt", "values": ["lots"]}]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Components, EtcdServer]]:
    etcd = start_etcd(tmp_path / "etcd")
    c = Components(tmp_path, etcd.url, agent_args=("--cpu-millicores", "4000"))
    yield c, etcd
    c.stop()
    etcd.stop()
    kill_process_workloads(tmp_path)


def bad_manifest(name: str) -> dict:  # type: ignore[type-arg]
    doc = yaml.safe_load(process_manifest(name))
    doc["spec"]["constraints"] = BAD_CONSTRAINTS
    return doc  # type: ignore[no-any-return]


def etcd_get(etcd: EtcdServer, key: str) -> bytes | None:
    async def get() -> bytes | None:
        store = open_store(etcd.url)
        try:
            kv = await store.get(key)
            return kv.value if kv else None
        finally:
            await store.close()

    return asyncio.run(get())


def etcd_put(etcd: EtcdServer, key: str, value: bytes) -> None:
    async def put() -> None:
        store = open_store(etcd.url)
        try:
            await store.put(key, value)
        finally:
            await store.close()

    asyncio.run(put())


def running(c: Components, name: str) -> dict | None:  # type: ignore[type-arg]
    w = c.workload(name)
    return w if w["phase"] == "Running" else None


def test_a_bad_stored_manifest_stops_nothing_else(cluster: tuple[Components, EtcdServer]) -> None:
    c, etcd = cluster
    c.ctl("apply", "-f", "-", stdin=process_manifest("before"))
    eventually(lambda: running(c, "before"), 40, "before Running")

    # Stored by an older version that accepted it: the engine cannot evaluate it.
    doc = bad_manifest("bad")
    stored = {"id": "bad", "name": "bad", "spec": doc["spec"], "revision": "0123456789ab", "generation": 1,
              "createdAt": time.time(), "updatedAt": time.time()}
    etcd_put(etcd, keys.workload("bad"), json.dumps(stored).encode())
    for name in ("after-a", "after-b"):
        c.ctl("apply", "-f", "-", stdin=process_manifest(name))
    for name in ("after-a", "after-b"):
        eventually(lambda n=name: running(c, n), 30, f"{name} Running despite the bad manifest")  # type: ignore[misc]

    bad, _ = eventually(lambda: (lambda w: w if w["reason"] == "InvalidSpec" else None)(c.workload("bad")), 15,
                        "bad marked")
    assert bad["phase"] == "Failed"
    assert "spec.constraints[0].values: Gt needs exactly one integer" in bad["message"]
    assert etcd_get(etcd, keys.workload("bad")) is not None, "kept: never deleted unasked"
    h = c.health()
    assert h["mode"] == "normal" and "refused by the model" in h["detail"] and "bad" in h["detail"]
    events = c.ctl("events", "-o", "json").stdout
    assert "WorkloadInvalid" in events

    # Deleting it completes (persysctl delete waits until the workload is gone).
    t0 = time.monotonic()
    c.ctl("delete", "workload", "bad")
    print(f"delete of the refused workload took {time.monotonic() - t0:.1f}s")
    assert etcd_get(etcd, keys.workload("bad")) is None
    eventually(lambda: "refused" not in c.health()["detail"], 10, "health no longer mentions it")

    # Still scheduling, and the scheduler stops promptly.
    c.ctl("apply", "-f", "-", stdin=process_manifest("last"))
    eventually(lambda: running(c, "last"), 30, "last Running")
    sched = c.scheduler
    assert sched.proc is not None
    t0 = time.monotonic()
    sched.proc.send_signal(signal.SIGTERM)
    code = sched.proc.wait(20)
    took = time.monotonic() - t0
    print(f"scheduler stopped in {took:.1f}s (exit {code})")
    assert took < 10 and code == 0, sched.text()[-2000:]


def test_the_api_refuses_the_bad_manifest_naming_the_field(cluster: tuple[Components, EtcdServer]) -> None:
    c, etcd = cluster
    # persysctl validates locally first; this goes straight to the gateway, as any client may.
    ctx = ssl.create_default_context(cafile=str(c.pki / "ca.crt"))
    ctx.load_cert_chain(str(c.pki / "admin.crt"), str(c.pki / "admin.key"))
    with httpx.Client(base_url=f"https://127.0.0.1:{c.gw_port}", verify=ctx, timeout=30) as http:
        for path, body in (("/v1/workloads", bad_manifest("bad-api")),
                           ("/v1/workloads:batch", [yaml.safe_load(process_manifest("ok-api")),
                                                    bad_manifest("bad-api")])):
            r = http.post(path, json=body)
            assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
            assert "spec.constraints[0].values: Gt needs exactly one integer" in r.text, r.text
            assert "Traceback" not in r.text
    assert etcd_get(etcd, keys.workload("bad-api")) is None and etcd_get(etcd, keys.workload("ok-api")) is None
    local = c.ctl("apply", "-f", "-", stdin=yaml.safe_dump(bad_manifest("bad-api")), check=False)
    assert local.returncode == 1 and "spec.constraints[0].values" in local.stderr and "Traceback" not in local.stderr
