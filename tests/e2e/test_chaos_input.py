"""Oversized and hostile input at the scheduler: huge manifests, batches heavier than one store
request, and lists walked a page at a time while workloads come and go.

Real etcd (its default --max-request-bytes, 1.5 MiB), scheduler and gateway processes; the
scheduler is called over gRPC with the admin certificate, as the gateway does."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.client import SchedulerClient, SchedulerError
from persys.model.limits import BATCH_MAX_BYTES, BATCH_MAX_ITEMS, MANIFEST_MAX_BYTES
from persys.store.etcd import EtcdStore
from persys.tlsfiles import TLSFiles
from tests.e2e.harness import Components, eventually
from tests.fixtures_infra import EtcdServer, start_etcd

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Components, EtcdServer]]:
    etcd = start_etcd(tmp_path / "etcd")
    c = Components(tmp_path, etcd.url, nodes=())  # no agents: workloads stay Pending, nothing runs
    yield c, etcd
    c.stop()
    etcd.stop()


def manifest(name: str, blob_bytes: int = 0) -> dict[str, Any]:
    env = {"BLOB": "x" * blob_bytes} if blob_bytes else {}
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"type": "process", "resources": {"cpuMillicores": 10, "memoryMb": 16},
                     "process": {"command": ["sleep", "3600"], "env": env}}}


def call(c: Components, fn: Any) -> Any:
    async def run() -> Any:
        client = SchedulerClient(c.target, TLSFiles(c.pki / "ca.crt", c.pki / "admin.crt", c.pki / "admin.key"),
                                 timeout=60)
        try:
            return await fn(client)
        finally:
            await client.close()

    return asyncio.run(run())


def stored_workloads(etcd: EtcdServer) -> dict[str, int]:
    """What etcd holds under /persys/workloads/: id -> size of the stored document."""
    async def read() -> dict[str, int]:
        store = EtcdStore([etcd.endpoint])
        try:
            kvs, _ = await store.range("/persys/workloads/")
            return {kv.key.rsplit("/", 1)[1]: len(kv.value) for kv in kvs}
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_batch_heavier_than_one_store_request_applies(cluster: tuple[Components, EtcdServer]) -> None:
    c, etcd = cluster
    docs = [manifest(f"heavy-{i:02d}", 200_000) for i in range(20)]  # ~4 MB: etcd takes 1.5 MiB a request
    results = call(c, lambda cl: cl.apply_many(docs))
    assert [(r["id"], r["created"]) for r in results] == [(f"heavy-{i:02d}", True) for i in range(20)]
    stored = stored_workloads(etcd)
    assert sorted(stored) == [f"heavy-{i:02d}" for i in range(20)]
    assert min(stored.values()) > 200_000
    one = call(c, lambda cl: cl.get_workload("heavy-07"))
    assert len(one["spec"]["process"]["env"]["BLOB"]) == 200_000
    assert c.scheduler.alive() and "Traceback" not in c.scheduler.text()


def test_oversized_manifests_and_batches_are_refused_naming_the_limit(
        cluster: tuple[Components, EtcdServer]) -> None:
    c, etcd = cluster
    with pytest.raises(SchedulerError) as huge:
        call(c, lambda cl: cl.apply(manifest("huge", 50 << 20)))
    assert huge.value.code == "INVALID_ARGUMENT"
    assert "manifest_json" in huge.value.message and "manifest limit of 1 MiB" in huge.value.message
    assert f"({MANIFEST_MAX_BYTES} bytes, MANIFEST_MAX_BYTES)" in huge.value.message

    with pytest.raises(SchedulerError) as many:
        call(c, lambda cl: cl.apply_many([manifest(f"m-{i}") for i in range(BATCH_MAX_ITEMS + 1)]))
    assert many.value.code == "INVALID_ARGUMENT" and "BATCH_MAX_ITEMS" in many.value.message

    per_doc = MANIFEST_MAX_BYTES - 4096  # each under the manifest limit, together over the batch's
    heavy = [manifest(f"b-{i}", per_doc) for i in range(BATCH_MAX_BYTES // per_doc + 1)]
    with pytest.raises(SchedulerError) as batch:
        call(c, lambda cl: cl.apply_many(heavy))
    assert batch.value.code == "INVALID_ARGUMENT" and "BATCH_MAX_BYTES" in batch.value.message

    with pytest.raises(SchedulerError) as one_in_batch:
        call(c, lambda cl: cl.apply_many([manifest("fine"), manifest("too-big", MANIFEST_MAX_BYTES)]))
    assert one_in_batch.value.code == "INVALID_ARGUMENT" and "manifests_json[1]" in one_in_batch.value.message

    assert stored_workloads(etcd) == {}, "nothing of a refused request is written"
    health = call(c, lambda cl: cl.health())
    assert health["active"] and health["mode"] == "normal"
    assert c.scheduler.alive() and "Traceback" not in c.scheduler.text()
    # The scheduler still takes a manifest just under the limit.
    ok = call(c, lambda cl: cl.apply(manifest("just-under", MANIFEST_MAX_BYTES - 4096)))
    assert ok["created"]


def test_pages_walk_every_workload_once_while_workloads_come_and_go(
        cluster: tuple[Components, EtcdServer]) -> None:
    c, _ = cluster
    names = [f"w-{i:03d}" for i in range(60)]
    call(c, lambda cl: cl.apply_many([manifest(n, 2000) for n in names]))
    eventually(lambda: len(call(c, lambda cl: cl.list_workloads())) == 60, 20, "60 workloads listed")

    seen: list[str] = []
    deleted: set[str] = set()
    added: set[str] = set()
    token = ""
    pages = 0
    while True:
        items, token = call(c, lambda cl, after=token: cl.list_page("workloads", limit=7, token=after))
        assert all("spec" not in w for w in items), "a list carries summaries, not specs"
        assert len(items) <= 7
        seen += [w["id"] for w in items]
        pages += 1
        # Between pages: remove one not yet walked and one already walked, add one ahead and one behind.
        ahead = [n for n in names if n > seen[-1] and n not in deleted]
        victims = [ahead[-1], seen[-1]] if ahead and pages < 5 else []
        for v in victims:
            call(c, lambda cl, v=v: cl.delete(v))
            deleted.add(v)
        if pages < 5:
            more = [f"w-{pages * 7 + 3:03d}x", f"a-{pages}"]
            call(c, lambda cl, more=more: cl.apply_many([manifest(n) for n in more]))
            added |= set(more)
        if not token:
            break
    assert len(seen) == len(set(seen)), "no workload is listed twice"
    assert seen == sorted(seen)
    stayed = [n for n in names if n not in deleted]
    assert set(stayed) <= set(seen), f"missing: {set(stayed) - set(seen)}"
    assert not any(s.startswith("a-") for s in seen), "added behind the position: not in this walk"
    assert pages >= 60 // 7

    with pytest.raises(SchedulerError) as bad:
        call(c, lambda cl: cl.list_page("workloads", token="not-a-token"))
    assert bad.value.code == "INVALID_ARGUMENT" and "continue" in bad.value.message

    # persysctl follows the tokens; an old client's plain GET still gets one JSON list.
    now = (set(names) | added) - deleted
    listed_now: list[set[str]] = []

    def settled() -> bool:
        listed_now.append({w["id"] for w in call(c, lambda cl: cl.list_workloads())})
        return listed_now[-1] == now

    try:
        eventually(settled, 20, "deletions done")
    except AssertionError:
        raise AssertionError(f"extra {listed_now[-1] - now}, missing {now - listed_now[-1]}") from None
    listed = json.loads(c.ctl("get", "workloads", "-o", "json", "--chunk-size", "4").stdout)
    assert sorted(w["id"] for w in listed) == sorted(now)
    as_yaml = yaml.safe_load(c.ctl("get", "workloads", "-o", "yaml", "--chunk-size", "4").stdout)
    assert sorted(w["id"] for w in as_yaml) == sorted(now)
    table = c.ctl("get", "workloads", "--chunk-size", "4").stdout
    assert table.count("NAME") == 1 and all(n in table for n in now)
    cfg = yaml.safe_load(Path(c.env["PERSYS_CONFIG"]).read_text())
    ctx = ssl.create_default_context(cafile=cfg["ca"])
    ctx.load_cert_chain(cfg["cert"], cfg["key"])
    with urllib.request.urlopen(f"{cfg['server']}/v1/workloads", context=ctx, timeout=30) as resp:
        legacy = json.loads(resp.read())
    assert sorted(w["id"] for w in legacy) == sorted(now)
    with urllib.request.urlopen(f"{cfg['server']}/v1/workloads?limit=5", context=ctx, timeout=30) as resp:
        paged = json.loads(resp.read())
    assert len(paged["items"]) == 5 and paged["continue"]
    with urllib.request.urlopen(f"{cfg['server']}/v1/nodes?limit=5", context=ctx, timeout=30) as resp:
        assert json.loads(resp.read()) == {"items": [], "continue": ""}
    one = json.loads(c.ctl("get", "workloads", "w-001", "-o", "json").stdout)
    assert len(one["spec"]["process"]["env"]["BLOB"]) == 2000, "one workload carries its spec"
