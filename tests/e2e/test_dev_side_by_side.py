"""Two `persys dev` clusters on one Docker engine, both with a node named alike and a container
workload of the same name: each keeps its own container (its name and labels carry the cluster's
id, from the data dir's CA); deleting the workload in one and restarting the other never touches
the other's container. (They shared `persys-<node>-<workload>` and destroyed each other's.)"""

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
    p.wait_for("Press Ctrl-C to stop.", timeout=60)
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

        def running(env: dict[str, str]) -> str | None:
            w = json.loads(ctl("get", "workload", "hello-docker", "-o", "json", env=env).stdout)
            return str(w["runtimeId"]) if w["phase"] == "Running" else None

        ids = [eventually(lambda env=env: running(env), 90, "hello-docker Running")[0] for env in envs]  # type: ignore[misc]
        assert ids[0] != ids[1], "two clusters, two containers"
        clusters = {client.containers.get(i).labels.get("persys.cluster") for i in ids}
        assert len(clusters) == 2 and "" not in clusters and None not in clusters

        # Restart cluster two's control plane: it adopts its own container, not one's.
        devs[1].stop(signal.SIGINT)
        devs[1] = _dev(homes[1])
        assert eventually(lambda: running(envs[1]), 60, "two's hello-docker adopted")[0] == ids[1]
        # Delete in one: two's container keeps running, untouched.
        ctl("delete", "workload", "hello-docker", env=envs[0])
        assert client.containers.get(ids[1]).status == "running"
        assert not client.containers.list(all=True, filters={"id": ids[0]})
        assert running(envs[1]) == ids[1]
        ctl("delete", "workload", "hello-docker", env=envs[1])
    finally:
        for d in devs:
            d.stop(signal.SIGINT)
        for home in homes:  # whatever a failed run left: only these two clusters' containers
            ca = home / "dev" / "pki" / "ca.crt"
            if ca.exists():
                label = f"persys.cluster={cluster_id_of_file(ca)}"
                for c in client.containers.list(all=True, filters={"label": label}):
                    c.remove(force=True)
