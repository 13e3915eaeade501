"""A workload's local volume for real (scheduler, agent and gateway processes, loop-mounted ext4
on this host): the agent probes and advertises its storage, provisions and mounts the volume
before the start, the data outlives the workload when the volume is retained, and the next
workload finds it (another process claiming it; the same container applied again); the volume
is detached once its workload is gone."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from persys.storage.ext4_images import can_grow_online
from tests.docker_fixtures import DockerEngine
from tests.e2e.harness import ctl, eventually
from tests.gateway.cluster import GatewayCluster, start_cluster
from tests.storage.loop_pool import cluster_pool, sweep_pool

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayCluster, Path]]:
    tmp = tmp_path_factory.mktemp("vol-local")
    # Process workloads run as nobody: the pool's parents must be traversable for it, as
    # /var/lib/persys is on a node (pytest's own folders are 0700).
    pool = Path(tempfile.mkdtemp(prefix="persys-pool-")) / "pool"
    pool.parent.chmod(0o711)
    storage = tmp / "storage.yaml"
    storage.write_text(f"local: {{pool: {pool}}}\n")
    c = start_cluster(tmp, with_agent=True, agent_args=("--storage", str(storage)))
    try:
        eventually(lambda: [n for n in c.client().get("/v1/nodes").json() if n["status"] == "Ready"], timeout=60,
                   what="node n1 Ready")
        yield c, cluster_pool(pool, tmp / "pki" / "ca.crt")  # where this cluster's volumes live
    finally:
        c.stop()
        sweep_pool(pool)
        shutil.rmtree(pool.parent, ignore_errors=True)


def keeper(retain: bool) -> dict[str, Any]:
    script = 'cat "$PERSYS_VOLUME_DATA/marker" 2>/dev/null || echo empty; echo kept > "$PERSYS_VOLUME_DATA/marker"; ' \
             "exec sleep 600"
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "keeper"},
            "spec": {"type": "process", "process": {"command": ["sh", "-c", script]},
                     "resources": {"cpuMillicores": 10, "memoryMb": 16},
                     "volumes": [{"name": "data", "driver": "local", "sizeMb": 8, "mountPath": "/data",
                                  "retain": retain}]}}


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def mounted(pool: Path, vid: str) -> bool:
    target = str(pool / "mounts" / vid)
    return any(line.split()[4] == target for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_the_node_advertises_what_its_probe_found(cluster: tuple[GatewayCluster, Path]) -> None:
    c, _ = cluster
    caps = c.client().get("/v1/nodes/n1").json()["capabilities"]
    assert {"local", "local:filesystem", "local:vm-disk"} <= set(caps["storageDrivers"])
    assert caps["storageMissing"]["nfs"] == "nfs not configured"
    # describe says it too (it showed the drivers present only; the reasons were in -o json alone)
    described = ctl("describe", "node", "n1", env=c.ctl_env()).stdout
    assert "  missing:      nfs: nfs not configured" in described, described


def test_a_retained_volume_keeps_its_data_for_the_next_workload(cluster: tuple[GatewayCluster, Path]) -> None:
    c, pool = cluster
    out = c.tmp / "agent" / "runtimes" / "process" / "keeper" / "stdout.log"
    # (The same workload applied again finds its volume too: the container case below. Here the
    # next workload is another one, claiming the retained record by name.)
    with c.client() as http:
        assert http.post("/v1/workloads", json=keeper(retain=True)).status_code == 201
        eventually(lambda: http.get("/v1/workloads/keeper").json()["phase"] == "Running", timeout=60,
                   what="keeper Running")
        # Its content, not the file: echo creates it before writing, and a keeper stopped in between
        # (under load) leaves an empty marker for the reader below.
        eventually(lambda: _text(pool / "mounts" / "keeper-data" / "marker") == "kept\n", timeout=30,
                   what="marker written")
        assert mounted(pool, "keeper-data")
        vol = http.get("/v1/volumes/keeper-data").json()
        assert vol["node"] == "n1" and vol["spec"]["reclaimPolicy"] == "Retain"
        # The agent's reports make the record say what the node did: provisioned at first attach,
        # and attached there for this workload (a record of its own, and the events).
        vol, _ = eventually(lambda: (v := http.get("/v1/volumes/keeper-data").json())["attachments"] and v,
                            timeout=30, what="the attachment recorded")
        got = [(a["node"], a["kind"], a["instances"]) for a in vol["attachments"]]
        assert got == [("n1", "filesystem", ["keeper"])]
        assert vol["phase"] == "Available" and vol["provisionedMb"] == 8
        assert {"VolumeProvisioned", "VolumeAttached"} <= _events(http, "keeper-data")

        http.delete("/v1/workloads/keeper")
        eventually(lambda: http.get("/v1/workloads/keeper").status_code == 404, timeout=60, what="keeper deleted")
        eventually(lambda: not mounted(pool, "keeper-data"), timeout=30, what="volume detached")
        eventually(lambda: not out.parent.exists(), timeout=30, what="the old copy removed from the node")
        assert (pool / "images" / "keeper-data.img").exists()  # retained: its data stays on the node
        eventually(lambda: http.get("/v1/volumes/keeper-data").json()["attachments"] == [], timeout=30,
                   what="the attachment record removed")
        assert "VolumeDetached" in _events(http, "keeper-data")

        # Another workload claims the retained volume by its record's name and finds the data.
        reader = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "reader"},
                  "spec": {"type": "process", "resources": {"cpuMillicores": 10, "memoryMb": 16},
                           "process": {"command": ["sh", "-c", 'cp "$PERSYS_VOLUME_DATA/marker" '
                                                   '"$PERSYS_VOLUME_DATA/seen"; exec sleep 600']},
                           "volumes": [{"name": "data", "claim": "keeper-data", "mountPath": "/data"}]}}
        assert http.post("/v1/workloads", json=reader).status_code == 201, "claim of the retained volume"
        seen = pool / "mounts" / "keeper-data" / "seen"
        eventually(lambda: seen.exists() and seen.read_text() == "kept\n", timeout=60, what="the data read back")
        assert http.get("/v1/volumes/keeper-data").json()["usedBy"] == ["reader"]
        http.delete("/v1/workloads/reader")
        eventually(lambda: http.get("/v1/workloads/reader").status_code == 404, timeout=60, what="reader deleted")
        eventually(lambda: not mounted(pool, "keeper-data"), timeout=30, what="volume detached again")


def test_reclaim_delete_removes_the_data_on_its_node(cluster: tuple[GatewayCluster, Path]) -> None:
    """`reclaimPolicy: Delete` (an inline volume without `retain`): when its workload goes, the
    node's agent is handed the delete, removes the image, and the record goes."""
    c, pool = cluster
    doc = keeper(retain=False)
    doc["metadata"]["name"] = "scratch"
    image = pool / "images" / "scratch-data.img"
    with c.client() as http:
        assert http.post("/v1/workloads", json=doc).status_code == 201
        eventually(lambda: _text(pool / "mounts" / "scratch-data" / "marker") == "kept\n", timeout=60,
                   what="scratch's marker written")
        assert image.exists()
        http.delete("/v1/workloads/scratch")
        eventually(lambda: http.get("/v1/volumes/scratch-data").status_code == 404, timeout=60,
                   what="the volume record gone once its node removed the data")
        assert not image.exists() and not mounted(pool, "scratch-data")
        assert "VolumeDeleted" in _events(http, "scratch-data")


def test_a_local_volume_grows_and_is_snapshotted_on_its_node(cluster: tuple[GatewayCluster, Path]) -> None:
    """A local Volume's snapshots, and growing it once it holds data, are carried out by the node
    holding it. Mounted, ext4 grows online where the agent has CAP_SYS_RESOURCE; where it lacks it
    (this CI container) the record says so (Failed, the reason naming it) and the node grows it
    offline once its workload is gone. Deleting the Volume removes image and snapshot."""
    c, pool = cluster
    volume: dict[str, Any] = {"apiVersion": "persys.dev/v1", "kind": "Volume", "metadata": {"name": "grow"},
              "spec": {"driver": "local", "sizeMb": 8}}
    user = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "grower"},
            "spec": {"type": "process", "resources": {"cpuMillicores": 10, "memoryMb": 16},
                     "process": {"command": ["sh", "-c", 'echo here > "$PERSYS_VOLUME_DATA/m"; exec sleep 600']},
                     "volumes": [{"name": "data", "claim": "grow", "mountPath": "/data"}]}}
    with c.client() as http:
        assert http.post("/v1/volumes", json=volume).status_code == 201
        assert http.post("/v1/workloads", json=user).status_code == 201
        eventually(lambda: http.get("/v1/volumes/grow").json()["provisionedMb"] == 8, timeout=60,
                   what="the volume provisioned on n1 and reported")
        assert http.post("/v1/volumes/grow/snapshots", json={"name": "s1"}).status_code == 200
        eventually(lambda: http.get("/v1/volumes/grow").json()["snapshots"] == ["s1"], timeout=60,
                   what="snapshot taken on its node (mounted: frozen for the copy)")
        assert (pool / "images" / "grow.img").is_file() and (pool / "snapshots" / "grow@s1.img").is_file()

        volume["spec"]["sizeMb"] = 16
        assert http.post("/v1/volumes", json=volume).status_code == 200
        if can_grow_online():
            eventually(lambda: http.get("/v1/volumes/grow").json()["provisionedMb"] == 16, timeout=60,
                       what="grown online on its node")
            assert _fs_mb(pool / "mounts" / "grow") > 12, "the mounted filesystem was not grown"
        else:
            failed, _ = eventually(lambda: (v := http.get("/v1/volumes/grow").json())["phase"] == "Failed" and v,
                                   timeout=60, what="the refusal recorded")
            assert "CAP_SYS_RESOURCE" in failed["reason"] and failed["provisionedMb"] == 8
        http.delete("/v1/workloads/grower")
        eventually(lambda: http.get("/v1/workloads/grower").status_code == 404, timeout=60, what="grower deleted")
        eventually(lambda: (v := http.get("/v1/volumes/grow").json())["provisionedMb"] == 16 and
                   v["phase"] == "Available", timeout=60, what="grown on its node (offline once detached)")
        assert (pool / "images" / "grow.img").stat().st_size == 16 << 20
        assert {"VolumeResized", "VolumeSnapshotted"} <= _events(http, "grow")

        eventually(lambda: http.delete("/v1/volumes/grow").status_code == 200, timeout=30,
                   what="the volume deletable once unused")
        eventually(lambda: http.get("/v1/volumes/grow").status_code == 404, timeout=60, what="volume gone")
        assert not (pool / "images" / "grow.img").exists() and not (pool / "snapshots" / "grow@s1.img").exists()


def _container(c: GatewayCluster, workload: str) -> str:
    from persys.agent.runtimes.docker import container_name
    from persys.security.cluster_id import cluster_id_of_file

    return container_name(workload, "n1", cluster_id_of_file(c.pki / "ca.crt"))


def _fs_mb(mount: Path) -> int:
    out = subprocess.run(["df", "--output=size", "-B1M", str(mount)], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    return int(out.split()[-1])


def _events(http: Any, vid: str) -> set[str]:
    return {e["kind"] for e in http.get("/v1/events", params={"subject": f"volume/{vid}", "limit": 1000}).json()}


def test_a_container_finds_its_retained_volume_again(cluster: tuple[GatewayCluster, Path],
                                                     docker_engine: DockerEngine) -> None:
    """The same for a container: the volume is bind-mounted at its mountPath."""
    c, pool = cluster
    name = docker_engine.workload_id("vol")
    doc = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
           "spec": {"type": "container", "resources": {"cpuMillicores": 10, "memoryMb": 16},
                    "container": {"image": docker_engine.image, "command": [
                        "sh", "-c", "cat /data/marker 2>/dev/null || echo empty; echo from-container > /data/marker; "
                                    "exec sleep 600"]},
                    "volumes": [{"name": "data", "driver": "local", "sizeMb": 8, "mountPath": "/data",
                                 "retain": True}]}}
    vid = f"{name}-data"
    try:
        with c.client() as http:
            for round_ in (1, 2):
                assert http.post("/v1/workloads", json=doc).status_code == 201
                eventually(lambda: http.get(f"/v1/workloads/{name}").json()["phase"] == "Running", timeout=90,
                           what=f"container Running ({round_})")
                expected = "from-container" if round_ == 2 else "empty"  # round 2 reads round 1's marker
                eventually(lambda expected=expected: expected in subprocess.run(  # type: ignore[misc]
                    ["docker", "logs", _container(c, name)], capture_output=True, text=True, timeout=30).stdout,
                    timeout=30, what=f"the container saying {expected!r}")
                eventually(lambda: _text(pool / "mounts" / vid / "marker") == "from-container\n", timeout=30,
                           what="marker written")
                http.delete(f"/v1/workloads/{name}")
                eventually(lambda: http.get(f"/v1/workloads/{name}").status_code == 404, timeout=60,
                           what="container deleted")
                eventually(lambda: not mounted(pool, vid), timeout=30, what="volume detached")
    finally:
        subprocess.run(["docker", "rm", "-f", _container(c, name)], capture_output=True, timeout=60)


def test_a_local_restore_and_clone_carry_the_data(cluster: tuple[GatewayCluster, Path]) -> None:
    """Through persysctl: data written to a local Volume, a snapshot of it, a volume restored from
    the snapshot and one cloned from the volume; a new workload on each reads the data back. (The
    node provisions a local volume at first attach: it used to format an empty filesystem there,
    the record Available and no error.)"""
    c, pool = cluster
    env = c.ctl_env()
    files = c.tmp / "restore"
    files.mkdir(exist_ok=True)

    def apply(name: str, text: str) -> None:
        (files / f"{name}.yaml").write_text(text)
        ctl("apply", "-f", str(files / f"{name}.yaml"), env=env)

    def user(name: str, claim: str, script: str) -> str:
        return ("apiVersion: persys.dev/v1\nkind: Workload\n"
                f"metadata: {{name: {name}}}\nspec:\n  type: process\n"
                "  resources: {cpuMillicores: 10, memoryMb: 16}\n"
                f"  process: {{command: [sh, -c, '{script}; exec sleep 600']}}\n"
                f"  volumes: [{{name: data, claim: {claim}, mountPath: /data}}]\n")

    apply("orig", "apiVersion: persys.dev/v1\nkind: Volume\nmetadata: {name: orig}\n"
                  "spec: {driver: local, sizeMb: 8}\n")
    apply("writer", user("writer", "orig", 'echo payload-1 > "$PERSYS_VOLUME_DATA/d"'))
    eventually(lambda: _text(pool / "mounts" / "orig" / "d") == "payload-1\n", timeout=60, what="data written")
    ctl("delete", "workload", "writer", env=env)
    eventually(lambda: not mounted(pool, "orig"), timeout=60, what="orig detached")
    ctl("volume", "snapshot", "create", "orig", "s1", env=env)
    with c.client() as http:
        eventually(lambda: http.get("/v1/volumes/orig").json()["snapshots"] == ["s1"], timeout=60,
                   what="snapshot taken on its node")
    ctl("volume", "snapshot", "restore", "orig", "s1", "--to", "restored", env=env)
    apply("cloned", "apiVersion: persys.dev/v1\nkind: Volume\nmetadata: {name: cloned}\n"
                    "spec: {driver: local, sizeMb: 8, source: {volume: orig}}\n")
    for vol in ("restored", "cloned"):
        got = json.loads(ctl("get", "volume", vol, "-o", "json", env=env).stdout)
        rec = got[0] if isinstance(got, list) else got
        assert rec["node"] == "n1", f"a local clone lives where its source does: {rec}"
        apply(f"read-{vol}", user(f"read-{vol}", vol, 'cp "$PERSYS_VOLUME_DATA/d" "$PERSYS_VOLUME_DATA/seen"'))
    for vol in ("restored", "cloned"):
        eventually(lambda vol=vol: _text(pool / "mounts" / vol / "seen") == "payload-1\n",  # type: ignore[misc]
                   timeout=60, what=f"the data read back from {vol}")
        ctl("delete", "workload", f"read-{vol}", env=env)
    # A clone of a local volume that never held data, or on another node, is refused naming the field.
    apply("empty", "apiVersion: persys.dev/v1\nkind: Volume\nmetadata: {name: empty}\n"
                   "spec: {driver: local, sizeMb: 8}\n")
    (files / "bad.yaml").write_text("apiVersion: persys.dev/v1\nkind: Volume\nmetadata: {name: bad}\n"
                                    "spec: {driver: local, sizeMb: 8, source: {volume: empty}}\n")
    bad = ctl("apply", "-f", str(files / "bad.yaml"), env=env, check=False)
    assert bad.returncode != 0 and "spec.source.volume" in bad.stdout + bad.stderr
    for w in ("read-restored", "read-cloned"):
        eventually(lambda w=w: ctl("get", "workload", w, env=env, check=False).returncode != 0,  # type: ignore[misc]
                   timeout=60, what=f"{w} deleted")
    for vol in ("restored", "cloned", "empty", "orig"):
        eventually(lambda vol=vol: ctl("delete", "volume", vol, env=env, check=False).returncode == 0,  # type: ignore[misc]
                   timeout=60, what=f"volume {vol} deleted")
