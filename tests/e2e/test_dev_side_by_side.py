"""Two `persys dev` clusters on one Docker engine, both with a node named alike, a container
workload and a compose app of the same names: each keeps its own container and project (their
names carry the cluster's id, from the data dir's CA); deleting the workloads in one and restarting
the other never touches the other's. (They shared `persys-<node>-<workload>` and `persys-<app>`
and destroyed each other's.)"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import docker
import pytest

from persys.security.cluster_id import cluster_id_of_file
from tests.e2e.harness import REPO, Proc, ctl, eventually, persys
from tests.fixtures_infra import free_port

pytestmark = pytest.mark.e2e


def _dev(home: Path) -> Proc:
    p = Proc("dev", persys("dev", "--port", "0", "--node-id", "twin-node"), home, env={"PERSYS_HOME": str(home)})
    p.wait_for("Press Ctrl-C to stop.", timeout=120)
    return p


def test_two_dev_clusters_on_one_engine_keep_apart(tmp_path: Path, docker_engine: object) -> None:
    homes = [tmp_path / "one", tmp_path / "two"]
    devs: list[Proc] = []
    client = docker.from_env()
    try:
        for home in homes:
            home.mkdir()
            devs.append(_dev(home))
        envs = [{"PERSYS_HOME": str(h)} for h in homes]
        for env in envs:
            manifest = (REPO / "examples/hello-docker.yaml").read_text().replace("18080", str(free_port()))
            ctl("apply", "-f", "-", env=env, stdin=manifest)
            app = (REPO / "examples/hello-compose.yaml").read_text().replace("18081", str(free_port()))
            ctl("apply", "-f", "-", env=env, stdin=app)

        def running(env: dict[str, str], name: str = "hello-docker") -> str | None:
            w = json.loads(ctl("get", "workload", name, "-o", "json", env=env).stdout)
            return str(w["runtimeId"]) if w["phase"] == "Running" else None

        ids = [eventually(lambda env=env: running(env), 90, "hello-docker Running")[0] for env in envs]  # type: ignore[misc]
        apps = [eventually(lambda env=env: running(env, "hello-compose"), 120,  # type: ignore[misc]
                           "hello-compose Running")[0] for env in envs]
        assert ids[0] != ids[1] and apps[0] != apps[1], "two clusters, two containers, two projects"
        clusters = {client.containers.get(i).labels.get("persys.cluster") for i in ids}
        assert len(clusters) == 2 and "" not in clusters and None not in clusters

        def project_up(project: str) -> bool:
            label = f"com.docker.compose.project={project}"
            return any(c.status == "running" for c in client.containers.list(all=True, filters={"label": label}))

        # Restart cluster two's control plane: it adopts its own container and app, not one's.
        devs[1].stop(signal.SIGINT)
        devs[1] = _dev(homes[1])
        assert eventually(lambda: running(envs[1]), 60, "two's hello-docker adopted")[0] == ids[1]
        assert eventually(lambda: running(envs[1], "hello-compose"), 60, "two's app adopted")[0] == apps[1]
        # Delete in one: two's container and project keep running, untouched.
        for name in ("hello-docker", "hello-compose"):
            ctl("delete", "workload", name, env=envs[0])
        assert client.containers.get(ids[1]).status == "running" and project_up(apps[1])
        assert not client.containers.list(all=True, filters={"id": ids[0]}) and not project_up(apps[0])
        assert running(envs[1]) == ids[1] and running(envs[1], "hello-compose") == apps[1]
        for name in ("hello-docker", "hello-compose"):
            ctl("delete", "workload", name, env=envs[1])
    finally:
        for d in devs:
            d.stop(signal.SIGINT)
        for home in homes:
            _remove_leftovers(client, home)


def _remove_leftovers(client: docker.DockerClient, home: Path) -> None:
    """Whatever a failed run left of one of these two clusters (and only theirs)."""
    ca = home / "dev" / "pki" / "ca.crt"
    if not ca.exists():
        return
    cluster = cluster_id_of_file(ca)
    app = f"com.docker.compose.project=persys-{cluster}-hello-compose"
    for label in (f"persys.cluster={cluster}", app):
        for c in client.containers.list(all=True, filters={"label": label}):
            c.remove(force=True)
    for v in client.volumes.list(filters={"label": app}):
        v.remove(force=True)
