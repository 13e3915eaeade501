"""Volume objects through the REST gateway and persysctl against a real scheduler process:
create, idempotent re-apply, growth, refusals naming the field with nothing written, claims,
single-writer conflicts, deletion refused while in use, inline volumes retained or reclaimed
with their workload."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import ctl, eventually
from tests.gateway.cluster import GatewayCluster, start_cluster

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    c = start_cluster(tmp_path_factory.mktemp("vols"), with_agent=False)  # no node: nothing is placed
    try:
        yield c
    finally:
        c.stop()


def volume(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "persys.dev/v1", "kind": "Volume", "metadata": {"name": name},
            "spec": {"driver": "ceph-rbd", "sizeMb": 64, **spec}}


def workload(name: str, volumes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"type": "process", "process": {"command": ["sleep", "600"]},
                     "resources": {"cpuMillicores": 10, "memoryMb": 8}, "volumes": volumes}}


def stored_keys(c: GatewayCluster) -> list[str]:
    with c.client() as http:
        return [i["key"] for i in http.get("/v1/admin/backup").json()["items"]]


def test_create_reapply_grow_and_refusals(cluster: GatewayCluster) -> None:
    with cluster.client() as http:
        r = http.post("/v1/volumes", json=volume("pg"))
        assert r.status_code == 201, r.text
        assert r.json()["volume"]["phase"] == "Pending"
        again = http.post("/v1/volumes", json=volume("pg"))
        assert again.status_code == 200 and not again.json()["changed"]
        grown = http.post("/v1/volumes", json=volume("pg", sizeMb=128))
        assert grown.json()["changed"] and grown.json()["volume"]["spec"]["sizeMb"] == 128
        for doc, field in [
            (volume("pg", sizeMb=32), "spec.sizeMb: 32 is smaller than 128: volumes only grow"),
            (volume("pg", sizeMb=128, driver="nfs"), "spec.driver: cannot change"),
            (volume("bad", sizeMb=0), "spec.sizeMb"),
            (volume("bad", sizeMb=-1), "spec.sizeMb"),
            (volume("bad", driver="iscsi"), "spec.driver"),
            (volume("bad", accessMode="MultiNodeWriter"), "accessMode: ceph-rbd does not offer MultiNodeWriter"),
            (volume("bad", source={"volume": "nope"}), "spec.source.volume: no volume 'nope'"),
            (volume("bad", source={"snapshot": "pg@s1"}), "spec.source.snapshot: volume 'pg' has no snapshot"),
            (volume("bad", reclaimPolicy="Delete"), "spec.reclaimPolicy: Delete removes a volume with the workload"),
            (volume("pg", sizeMb=128, reclaimPolicy="Delete"), "spec.reclaimPolicy: Delete"),
        ]:
            r = http.post("/v1/volumes", json=doc)
            assert r.status_code == 400, (doc, r.text)
            assert field in r.text, r.text
        assert http.get("/v1/volumes/bad").status_code == 404
        assert http.get("/v1/volumes/pg").json()["spec"]["sizeMb"] == 128
    assert not [k for k in stored_keys(cluster) if k.endswith("/bad")]


def test_claims_single_writer_and_delete_while_used(cluster: GatewayCluster) -> None:
    with cluster.client() as http:
        assert http.post("/v1/volumes", json=volume("data")).status_code == 201
        r = http.post("/v1/workloads", json=workload("nope", [{"name": "d", "claim": "missing", "mountPath": "/d"}]))
        assert r.status_code == 400 and "spec.volumes[0].claim: no volume 'missing'" in r.text
        assert http.get("/v1/workloads/nope").status_code == 404
        ok = http.post("/v1/workloads", json=workload("db", [{"name": "d", "claim": "data", "mountPath": "/d"}]))
        assert ok.status_code == 201, ok.text
        second = http.post("/v1/workloads", json=workload("db2", [{"name": "d", "claim": "data", "mountPath": "/d"}]))
        assert second.status_code == 400
        assert "SingleNodeWriter and used by workload db" in second.text
        assert http.get("/v1/workloads/db2").status_code == 404
        assert http.get("/v1/volumes/data").json()["usedBy"] == ["db"]
        busy = http.delete("/v1/volumes/data")
        assert busy.status_code == 409 and "used by workload db" in busy.text
        assert http.delete("/v1/workloads/db").status_code == 200
        eventually(lambda: http.get("/v1/workloads/db").status_code == 404, timeout=30, what="db deleted")
        gone = http.delete("/v1/volumes/data")
        assert gone.status_code == 200 and gone.json() == {"deleted": True, "alreadyGone": False}
        assert http.get("/v1/volumes/data").status_code == 404  # never provisioned: removed at once
        assert http.delete("/v1/volumes/data").json() == {"deleted": False, "alreadyGone": True}


def test_inline_volumes_follow_their_reclaim_policy(cluster: GatewayCluster) -> None:
    with cluster.client() as http:
        vols = [{"name": "keep", "driver": "local", "sizeMb": 16, "mountPath": "/k", "retain": True},
                {"name": "scratch", "driver": "local", "sizeMb": 16, "mountPath": "/s"}]
        assert http.post("/v1/workloads", json=workload("web", vols)).status_code == 201
        keep = http.get("/v1/volumes/web-keep").json()
        assert keep["owner"] == "web" and keep["spec"]["reclaimPolicy"] == "Retain"
        assert http.get("/v1/volumes/web-scratch").json()["spec"]["reclaimPolicy"] == "Delete"
        assert http.delete("/v1/volumes/web-keep").status_code == 409  # its workload uses it
        http.delete("/v1/workloads/web")
        eventually(lambda: http.get("/v1/workloads/web").status_code == 404, timeout=30, what="web deleted")
        assert http.get("/v1/volumes/web-scratch").status_code == 404  # Delete, never provisioned
        assert http.get("/v1/volumes/web-keep").json()["usedBy"] == []  # retained
        # The same workload again binds its retained volume (its data is kept).
        assert http.post("/v1/workloads", json=workload("web", vols)).status_code == 201
        assert http.get("/v1/volumes/web-keep").json()["usedBy"] == ["web"]


def test_persysctl_apply_get_describe_delete(cluster: GatewayCluster, tmp_path: Path) -> None:
    env = cluster.ctl_env()
    f = tmp_path / "vol.yaml"
    f.write_text("apiVersion: persys.dev/v1\nkind: Volume\nmetadata: {name: logs}\n"
                 "spec: {driver: nfs, sizeMb: 32, accessMode: MultiNodeWriter}\n")
    assert "volume/logs created" in ctl("apply", "-f", str(f), env=env).stdout
    assert "volume/logs unchanged" in ctl("apply", "-f", str(f), env=env).stdout
    table = ctl("get", "volumes", env=env).stdout
    assert "logs" in table and "MultiNodeWriter" in table
    assert "Driver:     nfs (Filesystem, MultiNodeWriter)" in ctl("describe", "volume", "logs", env=env).stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: persys.dev/v1\nkind: Volume\nmetadata: {name: x}\nspec: {driver: nfs, sizeMb: 0}\n")
    r = ctl("apply", "-f", str(bad), env=env, check=False)
    assert r.returncode != 0 and "spec.sizeMb" in r.stderr and "Traceback" not in r.stderr
    assert "volume/logs deletion requested" in ctl("delete", "volume", "logs", env=env).stdout
