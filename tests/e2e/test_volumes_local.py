"""A workload's local volume for real (scheduler, agent and gateway processes, loop-mounted ext4
on this host): the agent probes and advertises its storage, provisions and mounts the volume
before the start, the data outlives the workload when the volume is retained, and the same
workload applied again finds it; the volume is detached once its workload is gone."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import eventually
from tests.gateway.cluster import GatewayCluster, start_cluster
from tests.storage.loop_pool import sweep_pool

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
        yield c, pool
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


def mounted(pool: Path, vid: str) -> bool:
    target = str(pool / "mounts" / vid)
    return any(line.split()[4] == target for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_the_node_advertises_what_its_probe_found(cluster: tuple[GatewayCluster, Path]) -> None:
    c, _ = cluster
    caps = c.client().get("/v1/nodes/n1").json()["capabilities"]
    assert {"local", "local:filesystem", "local:vm-disk"} <= set(caps["storageDrivers"])
    assert caps["storageMissing"]["nfs"] == "nfs not configured"


def test_a_retained_volume_keeps_its_data_for_the_next_workload(cluster: tuple[GatewayCluster, Path]) -> None:
    c, pool = cluster
    out = c.tmp / "agent" / "runtimes" / "process" / "keeper" / "stdout.log"
    with c.client() as http:
        assert http.post("/v1/workloads", json=keeper(retain=True)).status_code == 201
        eventually(lambda: http.get("/v1/workloads/keeper").json()["phase"] == "Running", timeout=60,
                   what="keeper Running")
        eventually(lambda: (pool / "mounts" / "keeper-data" / "marker").exists(), timeout=30, what="marker written")
        assert mounted(pool, "keeper-data")
        vol = http.get("/v1/volumes/keeper-data").json()
        assert vol["node"] == "n1" and vol["spec"]["reclaimPolicy"] == "Retain"

        http.delete("/v1/workloads/keeper")
        eventually(lambda: http.get("/v1/workloads/keeper").status_code == 404, timeout=60, what="keeper deleted")
        eventually(lambda: not mounted(pool, "keeper-data"), timeout=30, what="volume detached")
        eventually(lambda: not out.parent.exists(), timeout=30, what="the old copy removed from the node")
        assert (pool / "images" / "keeper-data.img").exists()  # retained: its data stays on the node

        assert http.post("/v1/workloads", json=keeper(retain=True)).status_code == 201
        eventually(lambda: http.get("/v1/workloads/keeper").json()["phase"] == "Running", timeout=60,
                   what="keeper Running again")
        eventually(lambda: out.exists() and "kept" in out.read_text(), timeout=30, what="the old marker read back")
        http.delete("/v1/workloads/keeper")
        eventually(lambda: http.get("/v1/workloads/keeper").status_code == 404, timeout=60, what="keeper deleted")
