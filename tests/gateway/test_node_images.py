"""`persysctl image ls|rm` (issue #16) through a real scheduler, agent and gateway, against the
real Docker engine and the agent's VM image registry: images listed with the instances that use
them, removal refused while a workload uses one (409, nothing removed), done otherwise, and a
second removal says the node has none (exit 0: the command can be repeated)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker_fixtures import DockerEngine
from tests.e2e.harness import ctl, eventually
from tests.gateway.cluster import GatewayCluster, ready_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.docker]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, docker_engine: DockerEngine) -> Iterator[GatewayCluster]:
    with ready_cluster(tmp_path_factory.mktemp("images")) as c:
        yield c


def _images(c: GatewayCluster, *args: str) -> list[dict[str, Any]]:
    return list(json.loads(ctl("image", "ls", "--node", "n1", "-o", "json", *args, env=c.ctl_env()).stdout))


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)


def test_container_images_listed_refused_while_used_and_removed(cluster: GatewayCluster,
                                                                docker_engine: DockerEngine) -> None:
    tag = f"persys-test-images-{uuid.uuid4().hex[:8]}:1"
    assert _docker("tag", docker_engine.image, tag).returncode == 0
    name = docker_engine.workload_id("uses-image")
    manifest = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                "spec": {"type": "container", "resources": {"cpuMillicores": 10, "memoryMb": 16},
                         "container": {"image": tag, "command": ["sleep", "300"], "pullPolicy": "Never"}}}
    env = cluster.ctl_env()
    try:
        with cluster.client() as http:
            assert http.post("/v1/workloads", json=manifest).status_code == 201
        eventually(lambda: http_phase(cluster, name) == "Running", timeout=60, what="Running")
        (row,) = [r for r in _images(cluster) if r["name"] == tag]
        assert row["kind"] == "docker" and row["usedBy"] == [name] and row["size"] > 0 and row["node"] == "n1"
        assert row["id"].startswith("sha256:")
        assert tag in ctl("image", "ls", "--node", "n1", "-o", "wide", env=env).stdout

        refused = ctl("image", "rm", tag, "--node", "n1", env=env, check=False)
        assert refused.returncode == 1 and f"used by {name}" in refused.stderr + refused.stdout
        by_id = ctl("image", "rm", row["id"], "--node", "n1", env=env, check=False)  # the image under every tag
        assert by_id.returncode == 1 and f"used by {name}" in by_id.stderr + by_id.stdout
        assert _docker("image", "inspect", tag).returncode == 0  # nothing removed
        with cluster.client() as http:
            r = http.delete("/v1/nodes/n1/images", params={"kind": "docker", "name": tag})
            assert r.status_code == 409, r.text

        ctl("delete", "workload", name, env=env)
        eventually(lambda: not any(r["usedBy"] for r in _images(cluster) if r["name"] == tag), timeout=60,
                   what="no longer used")
        # The stopped container is gone with the workload, so the engine lets the tag go.
        done = ctl("image", "rm", tag, "--node", "n1", env=env)
        assert "removed" in done.stdout and _docker("image", "inspect", tag).returncode != 0
        again = ctl("image", "rm", tag, "--node", "n1", env=env)
        assert f"no docker image {tag} here" in again.stdout
        assert not [r for r in _images(cluster) if r["name"] == tag]
    finally:
        _docker("rmi", tag)


def test_vm_registry_images_listed_and_removed(cluster: GatewayCluster, tmp_path: Path) -> None:
    disk = tmp_path / "tiny.img"
    disk.write_bytes(b"\0" * (1 << 20))
    env = cluster.ctl_env()
    ctl("image", "load", "--kind", "disk", "--name", "tiny-disk", str(disk), "--node", "n1", env=env)
    (row,) = _images(cluster, "--kind", "disk")
    assert (row["name"], row["kind"], row["format"], row["size"], row["usedBy"]) == \
        ("tiny-disk", "disk", "raw", 1 << 20, [])
    wrong = ctl("image", "rm", "tiny-disk", "--node", "n1", env=env, check=False)  # --kind docker: not there
    assert wrong.returncode == 0 and "no docker image tiny-disk here" in wrong.stdout
    assert "disk tiny-disk removed" in ctl("image", "rm", "--kind", "disk", "tiny-disk", "--node", "n1",
                                           env=env).stdout
    assert _images(cluster, "--kind", "disk") == []
    assert cluster.agent is not None
    blobs = cluster.tmp / "agent" / "runtimes" / "images" / "blobs"
    assert not [p for p in blobs.iterdir() if not p.name.startswith(".")]


def http_phase(c: GatewayCluster, name: str) -> str:
    with c.client() as http:
        r = http.get(f"/v1/workloads/{name}")
        return str(r.json().get("phase", "")) if r.status_code == 200 else ""
