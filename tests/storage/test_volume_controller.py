"""The volume controller on a real scheduler process with an nfs backend (nfs-ganesha): a Volume
applied is provisioned on the export, a clone copies its source's data, growing it resizes the
image, deleting it removes the data and the record. The actions it takes are a pure decision,
tested by table first."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from persys.model.volume import Volume, VolumeObjectSpec, VolumePhase
from persys.scheduler.mirror.follower import Versioned
from persys.scheduler.work.volume_controller import actions
from persys.security.cluster_id import cluster_id_of_file
from tests.e2e.harness import eventually
from tests.gateway.cluster import GatewayCluster, start_cluster
from tests.nfs_server import NfsServer


def rec(name: str, phase: VolumePhase, provisioned: int = 0, size: int = 16, driver: str = "nfs") -> Versioned[Volume]:
    spec = VolumeObjectSpec.model_validate({"driver": driver, "sizeMb": size})
    return Versioned(Volume(id=name, spec=spec, phase=phase, provisioned_mb=provisioned, created_at=0, updated_at=0), 3)


def test_what_the_controller_does() -> None:
    vols = {"new": rec("new", VolumePhase.PENDING), "gone": rec("gone", VolumePhase.DELETING, 16),
            "grown": rec("grown", VolumePhase.AVAILABLE, 16, size=32), "same": rec("same", VolumePhase.AVAILABLE, 16),
            "retry": rec("retry", VolumePhase.FAILED), "later": rec("later", VolumePhase.FAILED),
            "mine": rec("mine", VolumePhase.PENDING, driver="local"), "ceph": rec("ceph", VolumePhase.PENDING,
                                                                                    driver="ceph-rbd")}
    snap = rec("snap", VolumePhase.AVAILABLE, 16)
    snap.value.wanted_snapshots = ["a", "b"]
    snap.value.snapshots = ["b", "old"]
    vols["snap"] = snap
    got = [(a.kind, a.volume.id, a.snapshot) for a in actions(vols, {"nfs", "local"}, {"later": 20.0}, now=10.0)]
    assert got == [("delete", "gone", ""), ("resize", "grown", ""), ("provision", "new", ""),
                   ("provision", "retry", ""), ("snapshot", "snap", "a")]
    snap.value.snapshots = ["a", "b", "old"]
    assert [(a.kind, a.snapshot) for a in actions({"snap": snap}, {"nfs"}, {}, 0.0)] == [("unsnapshot", "old")]


@pytest.fixture(scope="module")
def cluster(nfs_server: NfsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    tmp = tmp_path_factory.mktemp("vol-ctl")
    e = nfs_server.export
    (tmp / "storage.yaml").write_text(f"nfs: {{server: {e.server}, port: {e.port}, export: {e.export}}}\n")
    c = start_cluster(tmp, with_agent=False, scheduler_args=("--storage", str(tmp / "storage.yaml")))
    try:
        yield c
    finally:
        c.stop()


def volume(name: str, size: int = 16, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "persys.dev/v1", "kind": "Volume", "metadata": {"name": name},
            "spec": {"driver": "nfs", "sizeMb": size, **spec}}


def test_provision_clone_grow_delete(cluster: GatewayCluster, nfs_server: NfsServer) -> None:
    # The cluster's own folder on the export (its id from the CA: security.cluster_id).
    images = nfs_server.folder / "persys" / f"cluster-{cluster_id_of_file(cluster.pki / 'ca.crt')}"
    with cluster.client() as http:
        assert http.post("/v1/volumes", json=volume("base")).status_code == 201
        eventually(lambda: http.get("/v1/volumes/base").json()["phase"] == "Available", 60, "base provisioned")
        image = images / "base.img"
        assert image.stat().st_size == 16 * 1024 * 1024
        with image.open("r+b") as f:  # data the clone must carry (written on the server's disk)
            f.seek(1024 * 1024)
            f.write(b"persys-marker")
        assert http.post("/v1/volumes", json=volume("copy", source={"volume": "base"})).status_code == 201
        eventually(lambda: http.get("/v1/volumes/copy").json()["phase"] == "Available", 60, "clone provisioned")
        with (images / "copy.img").open("rb") as f:
            f.seek(1024 * 1024)
            assert f.read(13) == b"persys-marker"
        assert http.post("/v1/volumes", json=volume("base", size=48)).json()["changed"]
        eventually(lambda: http.get("/v1/volumes/base").json()["provisionedMb"] == 48, 60, "base grown")
        assert image.stat().st_size == 48 * 1024 * 1024
        # A snapshot asked for is taken by the controller; a volume restored from it has its data.
        assert http.post("/v1/volumes/base/snapshots", json={"name": "s1"}).json()["changed"]
        assert not http.post("/v1/volumes/base/snapshots", json={"name": "s1"}).json()["changed"]
        eventually(lambda: "s1" in http.get("/v1/volumes/base").json()["snapshots"], 60, "snapshot taken")
        assert http.post("/v1/volumes/base/snapshots", json={"name": "Bad_Name"}).status_code in (400, 422)
        restored = volume("back", size=48, source={"snapshot": "base@s1"})
        assert http.post("/v1/volumes", json=restored).status_code == 201
        eventually(lambda: http.get("/v1/volumes/back").json()["phase"] == "Available", 60, "restored")
        with (images / "back.img").open("rb") as f:
            f.seek(1024 * 1024)
            assert f.read(13) == b"persys-marker"
        http.delete("/v1/volumes/base/snapshots/s1")
        eventually(lambda: "s1" not in http.get("/v1/volumes/base").json()["snapshots"], 60, "snapshot removed")
        assert http.delete("/v1/volumes/back").json()["deleted"]
        for name in ("copy", "base"):
            assert http.delete(f"/v1/volumes/{name}").json()["deleted"]
            eventually(lambda name=name: http.get(f"/v1/volumes/{name}").status_code == 404, 60, f"{name} gone")
            assert not (images / f"{name}.img").exists()
        kinds = [e["kind"] for e in http.get("/v1/events", params={"limit": 200}).json()
                 if e["subject"] in ("volume/base", "volume/copy")]
        assert {"VolumeCreated", "VolumeProvisioned", "VolumeResized", "VolumeSnapshotted", "VolumeSnapshotDeleted",
                "VolumeDeleting", "VolumeDeleted"} <= set(kinds)
