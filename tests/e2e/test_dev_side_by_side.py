"""Two `persys dev` clusters on one Docker engine, both with a node named alike, a container
workload and a compose app of the same names: each keeps its own container and project (their
names carry the cluster's id, from the data dir's CA); deleting the workloads in one and restarting
the other never touches the other's. (They shared `persys-<node>-<workload>` and `persys-<app>`
and destroyed each other's.) A process workload with a secret file and a local volume alike: its
cgroup, its secret folder, its uid claim and the loop device of its volume carry its cluster's id,
and survive the other cluster's restart (startup adoption and cleanup) and deletes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import docker
import pytest

from persys.agent.runtimes.process_isolation import CLAIMS_DIR, ClaimHolder
from persys.agent.runtimes.secret_files import RUN_ROOT as SECRETS
from persys.security.cluster_id import cluster_id_of_file
from persys.storage import node_mounts as nm
from tests.e2e.harness import REPO, Proc, ctl, eventually, persys
from tests.fixtures_infra import free_port

pytestmark = pytest.mark.e2e


def _dev(home: Path) -> Proc:
    p = Proc("dev", persys("dev", "--port", "0", "--node-id", "twin-node"), home, env={"PERSYS_HOME": str(home)})
    p.wait_for("Press Ctrl-C to stop.", timeout=120)
    return p


PROCESS = """
apiVersion: persys.dev/v1
kind: Secret
metadata: {name: twin-secret}
stringData: {token: twin}
---
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: twin-proc}
spec:
  type: process
  onDisconnect: Keep  # the restart below must find it running (not stopped by the node guard)
  resources: {cpuMillicores: 10, memoryMb: 16}
  process:
    command: [sh, -c, 'echo up > "$PERSYS_VOLUME_DATA/up"; exec sleep 3600']
  secrets:
    files: [{path: token, secretRef: {name: twin-secret, key: token}}]
  volumes:
    - {name: data, driver: local, sizeMb: 8, mountPath: /data}
"""


def _host_objects(pid: int, home: Path) -> tuple[str, str, str]:
    """(memory cgroup, secret folder, loop device backing file) of the process instance `pid`
    (its supervised wrapper: the command runs in namespaces of its own) of the cluster in `home`."""
    cgroup = next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                  if line.split(":")[1] == "memory")
    instance = cgroup.rsplit("/", 1)[1]
    (secrets,) = [str(p) for p in SECRETS.glob(f"{cluster_id_of_file(home / 'dev' / 'pki' / 'ca.crt')}-*/{instance}")]
    (loop,) = [d.back_file for d in nm.loop_devices(30) if d.back_file.startswith(f"{home}/")]
    return cgroup, secrets, loop


def _settled(pid: int, home: Path) -> tuple[str, str, str]:
    def found() -> tuple[str, str, str] | None:
        got = _host_objects(pid, home)
        return got if got[0].startswith("/persys/") else None

    return eventually(found, 60, f"instance {pid} in its cgroup, with its secrets and volume")[0]


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
            ctl("apply", "-f", "-", env=env, stdin=PROCESS)

        def running(env: dict[str, str], name: str = "hello-docker") -> str | None:
            w = json.loads(ctl("get", "workload", name, "-o", "json", env=env).stdout)
            return str(w["runtimeId"]) if w["phase"] == "Running" else None

        ids = [eventually(lambda env=env: running(env), 90, "hello-docker Running")[0] for env in envs]  # type: ignore[misc]
        apps = [eventually(lambda env=env: running(env, "hello-compose"), 120,  # type: ignore[misc]
                           "hello-compose Running")[0] for env in envs]
        assert ids[0] != ids[1] and apps[0] != apps[1], "two clusters, two containers, two projects"
        clusters = {client.containers.get(i).labels.get("persys.cluster") for i in ids}
        assert len(clusters) == 2 and "" not in clusters and None not in clusters
        pids = [int(eventually(lambda env=env: running(env, "twin-proc"), 90,  # type: ignore[misc]
                               "twin-proc Running")[0]) for env in envs]
        cids = [cluster_id_of_file(h / "dev" / "pki" / "ca.crt") for h in homes]
        # Polled: the wrapper moves itself into its cgroup just after it starts.
        objects = [_settled(pid, home) for pid, home in zip(pids, homes, strict=True)]
        for cid, (cgroup, secrets, loop) in zip(cids, objects, strict=True):
            assert cgroup.startswith(f"/persys/{cid}-twin-node/"), cgroup
            assert Path(secrets).parent.name.startswith(f"{cid}-"), secrets
            assert f"/cluster-{cid}/images/" in loop, loop
        assert objects[0][0] != objects[1][0] and objects[0][1] != objects[1][1]
        claims = [_claims_of(cid) for cid in cids]  # the host's uid claims, each naming its cluster
        assert all(len(c) == 1 for c in claims) and set(claims[0]) != set(claims[1]), claims

        def project_up(project: str) -> bool:
            label = f"com.docker.compose.project={project}"
            return any(c.status == "running" for c in client.containers.list(all=True, filters={"label": label}))

        # Restart cluster two's control plane: it adopts its own container and app, not one's.
        devs[1].stop(signal.SIGINT)
        devs[1] = _dev(homes[1])
        assert eventually(lambda: running(envs[1]), 60, "two's hello-docker adopted")[0] == ids[1]
        assert eventually(lambda: running(envs[1], "hello-compose"), 60, "two's app adopted")[0] == apps[1]
        assert eventually(lambda: running(envs[1], "twin-proc"), 60, "two's process adopted")[0] == str(pids[1])
        assert [_host_objects(p, h) for p, h in zip(pids, homes, strict=True)] == objects  # nothing moved
        # Delete in one: two's container and project keep running, untouched.
        for name in ("hello-docker", "hello-compose", "twin-proc"):
            ctl("delete", "workload", name, env=envs[0])
        eventually(lambda: not Path(f"/proc/{pids[0]}").exists(), 60, "one's process gone")
        assert _host_objects(pids[1], homes[1]) == objects[1] and Path(objects[1][1], "token").read_text() == "twin"
        assert Path(f"/sys/fs/cgroup/memory{objects[1][0]}/cgroup.procs").read_text().split().count(str(pids[1])) == 1
        assert client.containers.get(ids[1]).status == "running" and project_up(apps[1])
        assert not client.containers.list(all=True, filters={"id": ids[0]}) and not project_up(apps[0])
        assert running(envs[1]) == ids[1] and running(envs[1], "hello-compose") == apps[1]
        for name in ("hello-docker", "hello-compose", "twin-proc"):
            ctl("delete", "workload", name, env=envs[1])
        eventually(lambda: not Path(f"/proc/{pids[1]}").exists(), 60, "two's process gone")
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
    _remove_process_leftovers(cluster, home)


def _kill_cgroup_processes(cluster: str) -> None:
    """Every process left in the twin node's instance cgroups, killed."""
    for ctl_dir in Path("/sys/fs/cgroup").glob(f"*/persys/{cluster}-twin-node"):
        for cg in (d for d in ctl_dir.iterdir() if d.is_dir()):
            for pid in (cg / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def _remove_process_leftovers(cluster: str, home: Path) -> None:
    """Its process instances (persys dev leaves workloads running when it stops), their volumes'
    mounts (the loop devices go with them), secret folders, cgroups and uid claims."""
    _kill_cgroup_processes(cluster)
    for m in reversed(nm.parse_mountinfo(Path("/proc/self/mountinfo").read_text())):
        if m.mount_point.startswith(f"{home}/"):
            subprocess.run(["umount", "-l", m.mount_point], capture_output=True, timeout=30)
    for folder in SECRETS.glob(f"{cluster}-*"):
        subprocess.run(["rm", "-rf", str(folder)], capture_output=True, timeout=30)
    for uid in _claims_of(cluster):
        with contextlib.suppress(OSError):
            (CLAIMS_DIR / str(uid)).unlink()
    for ctl_dir in Path("/sys/fs/cgroup").glob(f"*/persys/{cluster}-twin-node"):
        for cg in [*(d for d in ctl_dir.iterdir() if d.is_dir()), ctl_dir]:
            with contextlib.suppress(OSError):  # emptied by the kill: gone once the kernel reaps
                cg.rmdir()


def _claims_of(cluster: str) -> dict[int, ClaimHolder]:
    """The uid claims on this host that name `cluster`."""
    out = {}
    for claim in CLAIMS_DIR.glob("[0-9]*"):
        with contextlib.suppress(OSError):
            holder = ClaimHolder.parse(claim.read_text())
            if holder is not None and holder.cluster == cluster:
                out[int(claim.name)] = holder
    return out
