"""The whole flow with every component a separate process: etcd, Redis, scheduler, agent and
gateway talking gRPC/HTTPS over mutual TLS, driven by persysctl, running real containers and
processes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
import yaml

from persys.security.cluster_id import cluster_id_of_file
from tests.e2e.harness import GATEWAY_PORT, REPO, SCHEDULER_PORT, Proc, ctl, eventually, persys, pid_alive
from tests.fixtures_infra import EtcdServer, RedisServer, free_port, start_etcd, start_redis

pytestmark = pytest.mark.e2e
NODE = "e2e-node"


@dataclass
class Cluster:
    tmp: Path
    env: dict[str, str]
    etcd: EtcdServer
    redis: RedisServer
    scheduler: Proc
    agent: Proc
    gateway: Proc
    http_port: int

    def get(self, name: str) -> dict:
        return json.loads(ctl("get", "workloads", name, "-o", "json", env=self.env).stdout)

    def running(self, name: str) -> dict | None:
        w = self.get(name)
        return w if w["phase"] == "Running" else None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, docker_engine: object) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("e2e")
    etcd = start_etcd(tmp / "etcd")
    redis = start_redis(tmp / "redis")
    pki = tmp / "pki"
    Proc("certs", persys("certs", "init", "--dir", str(pki), "--node", NODE), tmp).proc.wait(30)  # type: ignore[union-attr]
    scheduler = Proc("scheduler", persys("scheduler", "--listen", "127.0.0.1:0", "--store", etcd.url,
                                         "--events", redis.url, "--tls-dir", str(pki),
                                         "--data-dir", str(tmp / "scheduler"),
                                         # An agent restart on a busy machine (load 15) took 16 s:
                                         # past the default 10 s grace its node was lost and its
                                         # workloads re-placed, which is not what these tests are about.
                                         "--node-grace", "60"), tmp)
    sched_port = scheduler.bound_port(SCHEDULER_PORT)
    agent = Proc("agent", persys("agent", "--scheduler", f"127.0.0.1:{sched_port}", "--node-id", NODE,
                                 "--tls-dir", str(pki), "--state-dir", str(tmp / "agent")), tmp)
    gateway = Proc("gateway", persys("gateway", "--scheduler", f"127.0.0.1:{sched_port}",
                                     "--listen", "127.0.0.1:0", "--tls-dir", str(pki)), tmp)
    gw_port = gateway.bound_port(GATEWAY_PORT)
    agent.wait_for("agent e2e-node started")
    cfg = tmp / "persysctl.yaml"
    cfg.write_text(yaml.safe_dump({"server": f"https://127.0.0.1:{gw_port}", "ca": str(pki / "ca.crt"),
                                   "cert": str(pki / "admin.crt"), "key": str(pki / "admin.key")}))
    # The container's published host port is bound by dockerd, not by us: still picked here.
    c = Cluster(tmp, {"PERSYS_CONFIG": str(cfg)}, etcd, redis, scheduler, agent, gateway, free_port())
    eventually(lambda: json.loads(ctl("get", "nodes", "-o", "json", env=c.env).stdout), what="node registered")
    yield c
    for p in (gateway, agent, scheduler):
        p.stop()
    # The agent leaves workloads running by design; remove whatever a failed test left behind.
    client = docker.from_env()
    for cont in client.containers.list(all=True, filters={"label": "persys.workload"}):
        if cont.name in (_name(c, "hello-docker"), _name(c, "hello-process")):
            cont.remove(force=True)
    etcd.stop()
    redis.stop()


def _name(c: Cluster, workload: str) -> str:
    """The container's name: it carries the cluster's id (from its CA) and the node."""
    from persys.agent.runtimes.docker import container_name
    from persys.security.cluster_id import cluster_id_of_file

    return container_name(workload, NODE, cluster_id_of_file(c.tmp / "pki" / "ca.crt"))


def _docker_manifest(port: int) -> str:
    text = (REPO / "examples/hello-docker.yaml").read_text()
    return text.replace("hostPort: 18080", f"hostPort: {port}")


def test_apply_reaches_running_on_the_node(cluster: Cluster) -> None:
    ctl("apply", "-f", str(REPO / "examples/hello-process.yaml"), env=cluster.env)
    ctl("apply", "-f", "-", env=cluster.env, stdin=_docker_manifest(cluster.http_port))
    _, t_proc = eventually(lambda: cluster.running("hello-process"), 10, "hello-process Running")
    _, t_cont = eventually(lambda: cluster.running("hello-docker"), 10, "hello-docker Running")
    print(f"apply-to-Running: process {t_proc:.2f}s, container {t_cont:.2f}s")
    table = ctl("get", "workloads", env=cluster.env).stdout
    for name in ("hello-process", "hello-docker"):
        line = next(line for line in table.splitlines() if line.startswith(name))
        assert "Running" in line and NODE in line
    # The container really serves on its published port.
    import urllib.request

    body, _ = eventually(lambda: urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_port}/", timeout=2).read(),
                         10, "container serving")
    assert body == b"hello from persys\n"
    # Applying the same manifest again changes nothing.
    again = ctl("apply", "-f", str(REPO / "examples/hello-process.yaml"), env=cluster.env).stdout
    assert "unchanged" in again


def test_events_reach_redis_and_health_reports_it(cluster: Cluster) -> None:
    # Idempotent: the workload the first test applied (this one may run alone).
    ctl("apply", "-f", str(REPO / "examples/hello-process.yaml"), env=cluster.env)
    want = {"NodeJoined", "WorkloadScheduled", "WorkloadRunning"}

    def kinds() -> set[str] | None:  # the outbox publishes after the commit: a moment later under load
        got = {e["kind"] for e in json.loads(ctl("events", "-o", "json", env=cluster.env).stdout)}
        return got if want <= got else None

    eventually(kinds, 60, "the events in Redis")
    health = json.loads(ctl("health", "-o", "json", env=cluster.env).stdout)
    assert health["mode"] == "normal" and health["eventsOk"] and health["storeBackend"] == "etcd"


def _ours(c: Cluster, workload: str) -> list[str]:
    """Labels of this cluster's containers of `workload` (other suites on the engine run theirs)."""
    return [f"persys.workload={workload}", f"persys.cluster={cluster_id_of_file(c.tmp / 'pki' / 'ca.crt')}"]


def test_agent_restart_adopts_its_workloads(cluster: Cluster) -> None:
    client = docker.from_env()
    before_c = client.containers.get(_name(cluster, "hello-docker"))
    before_started = before_c.attrs["State"]["StartedAt"]
    before_pid = int(cluster.get("hello-process")["runtimeId"])
    cluster.agent.stop()
    assert pid_alive(before_pid), "the workload must outlive its agent"
    cluster.agent.start()
    cluster.agent.wait_for("agent e2e-node started")
    time.sleep(3)  # several reconcile passes of the new agent
    after = client.containers.list(all=True, filters={"label": _ours(cluster, "hello-docker")})
    assert [c.id for c in after] == [before_c.id], "no second container"
    after_c = client.containers.get(_name(cluster, "hello-docker"))
    assert after_c.attrs["State"]["StartedAt"] == before_started, "container was not restarted"
    w = cluster.get("hello-process")
    assert int(w["runtimeId"]) == before_pid and w["restarts"] == 0 and w["phase"] == "Running"


@pytest.mark.parametrize(
    ("edit", "field_path"),
    [
        (("cpuMillicores: 250", "cpuMillicores: lots"), "spec.resources.cpuMillicores"),
        (("memoryMb: 64", "memoryMb: 64\n    gpus: 1"), "spec.resources.gpus"),
        (("    image: persys/busybox:latest\n", ""), "spec.container.image"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(cluster: Cluster, edit: tuple[str, str], field_path: str) -> None:
    text = _docker_manifest(cluster.http_port).replace("name: hello-docker", "name: bad-one")
    bad = text.replace(*edit)
    assert bad != text
    p = ctl("apply", "-f", "-", env=cluster.env, stdin=bad, check=False)
    assert p.returncode != 0
    assert field_path in p.stderr and "Traceback" not in p.stderr + p.stdout
    assert len(p.stderr.strip().splitlines()) == 1
    # The server refuses it too, when a client skips local validation.
    doc = yaml.safe_load(bad)
    import ssl
    import urllib.request

    cfg = yaml.safe_load(Path(cluster.env["PERSYS_CONFIG"]).read_text())
    ctx = ssl.create_default_context(cafile=cfg["ca"])
    ctx.load_cert_chain(cfg["cert"], cfg["key"])
    req = urllib.request.Request(f"{cfg['server']}/v1/workloads", data=json.dumps(doc).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, context=ctx, timeout=10)
    assert exc.value.code == 400 and field_path in exc.value.read().decode()
    names = [w["name"] for w in json.loads(ctl("get", "workloads", "-o", "json", env=cluster.env).stdout)]
    assert "bad-one" not in names


def test_delete_stops_the_process_and_the_container(cluster: Cluster) -> None:
    pid = int(cluster.get("hello-process")["runtimeId"])
    ctl("delete", "workload", "hello-process", env=cluster.env)
    ctl("delete", "-f", "-", env=cluster.env, stdin=_docker_manifest(cluster.http_port))
    assert not pid_alive(pid)
    client = docker.from_env()
    assert client.containers.list(all=True, filters={"label": _ours(cluster, "hello-docker")}) == []
    assert json.loads(ctl("get", "workloads", "-o", "json", env=cluster.env).stdout) == []
    again = ctl("delete", "workload", "hello-process", env=cluster.env).stdout
    assert "already gone" in again


def test_scheduling_continues_when_redis_is_down(cluster: Cluster) -> None:
    cluster.redis.stop()
    try:
        ctl("apply", "-f", str(REPO / "examples/hello-process.yaml"), env=cluster.env)
        eventually(lambda: cluster.running("hello-process"), 10, "Running without Redis")
        # Health answers from the dependencies' latest probe (one per health interval), so the
        # outage shows once the next probe ran, not in the instant Redis stopped.
        def events_down() -> dict | None:
            health = json.loads(ctl("health", "-o", "json", env=cluster.env).stdout)
            return health if health["eventsOk"] is False else None
        health, _ = eventually(events_down, 15, "events reported down")
        assert "events" in health["detail"]
    finally:
        cluster.redis.start()
    eventually(lambda: json.loads(ctl("health", "-o", "json", env=cluster.env).stdout)["eventsOk"], 10, "events back")
    ctl("delete", "workload", "hello-process", env=cluster.env)


def test_usage_is_reported(cluster: Cluster) -> None:
    ctl("apply", "-f", str(REPO / "examples/hello-process.yaml"), env=cluster.env)
    ctl("apply", "-f", "-", env=cluster.env, stdin=_docker_manifest(cluster.http_port))

    def with_usage(name: str) -> dict | None:
        view = cluster.get(name)
        return view if view["usage"]["memoryBytes"] > 0 else None

    for name in ("hello-process", "hello-docker"):
        found, _ = eventually(lambda n=name: with_usage(n), 20, f"{name} memory usage reported")
        assert found["phase"] == "Running"
    top = json.loads(ctl("top", "-o", "json", env=cluster.env).stdout)
    assert {r["name"] for r in top} == {"hello-process", "hello-docker"}
    assert all(r["memoryBytes"] > 0 for r in top)
    assert "hello from persys" in ctl("logs", "hello-process", env=cluster.env).stdout
    assert "serving on 8080" in ctl("logs", "hello-docker", "--tail", "5", env=cluster.env).stdout
    ctl("delete", "workload", "hello-process", env=cluster.env)
    ctl("delete", "workload", "hello-docker", env=cluster.env)


def test_stop_start_restart(cluster: Cluster) -> None:
    ctl("apply", "-f", str(REPO / "examples/hello-process.yaml"), env=cluster.env)
    first, _ = eventually(lambda: cluster.running("hello-process"), 10, "Running")
    pid = int(first["runtimeId"])
    ctl("restart", "hello-process", env=cluster.env)
    again, _ = eventually(lambda: (lambda w: w if w and int(w["runtimeId"]) != pid else None)(
        cluster.running("hello-process")), 15, "Running as a fresh process")
    assert not pid_alive(pid) and again["revision"].endswith("-1")
    # Re-applying the unchanged manifest keeps the restarted revision: nothing is replaced.
    assert "unchanged" in ctl("apply", "-f", str(REPO / "examples/hello-process.yaml"), env=cluster.env).stdout
    ctl("stop", "hello-process", env=cluster.env)
    stopped, _ = eventually(lambda: (lambda w: w if w["phase"] == "Stopped" else None)(cluster.get("hello-process")),
                            15, "Stopped")
    assert not pid_alive(int(again["runtimeId"])) and stopped["desiredState"] == "Stopped"
    ctl("start", "hello-process", env=cluster.env)
    eventually(lambda: cluster.running("hello-process"), 15, "Running again")
    ctl("delete", "workload", "hello-process", env=cluster.env)


def test_images_are_loaded_without_a_registry(cluster: Cluster, tmp_path: Path) -> None:
    import shutil as sh
    import tarfile

    client = docker.from_env()
    # A root filesystem tarball becomes a container image (docker import).
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        tar.add(sh.which("busybox") or "/bin/busybox", arcname="bin/busybox")
        info = tarfile.TarInfo("bin/sh")
        info.type, info.linkname = tarfile.SYMTYPE, "busybox"
        tar.addfile(info)
    out = ctl("image", "load", "--kind", "rootfs", "--name", "persys/e2e-loaded:1", str(rootfs),
              env=cluster.env).stdout
    assert "imported" in out
    assert client.images.get("persys/e2e-loaded:1")
    # A `docker save` tarball is loaded as is.
    saved = tmp_path / "saved.tar"
    client.images.get("persys/e2e-loaded:1").tag("persys/e2e-saved", "1")
    saved.write_bytes(b"".join(client.images.get("persys/e2e-saved:1").save(named="persys/e2e-saved:1")))
    client.images.remove("persys/e2e-saved:1")
    assert "persys/e2e-saved:1" in ctl("image", "load", str(saved), env=cluster.env).stdout
    assert client.images.get("persys/e2e-saved:1")
    # A VM disk goes into the node's image registry under its name.
    disk = tmp_path / "disk.raw"
    disk.write_bytes(b"\0" * 65536)
    out = ctl("image", "load", "--kind", "disk", "--name", "tiny-disk", str(disk), env=cluster.env).stdout
    assert "disk tiny-disk registered" in out
    bad = ctl("image", "load", "--kind", "floppy", str(disk), env=cluster.env, check=False)
    assert bad.returncode == 1 and "kind must be one of" in bad.stderr
    for ref in ("persys/e2e-loaded:1", "persys/e2e-saved:1"):
        client.images.remove(ref, force=True)


def test_terminal_failure_is_reported_and_not_retried(cluster: Cluster) -> None:
    manifest = _docker_manifest(cluster.http_port).replace("name: hello-docker", "name: no-image").replace(
        "image: persys/busybox:latest", "image: persys/not-built-here:1\n    pullPolicy: Never").replace(
        f"hostPort: {cluster.http_port}", "hostPort: 0")
    ctl("apply", "-f", "-", env=cluster.env, stdin=manifest)
    w, _ = eventually(lambda: (lambda v: v if v["phase"] == "Failed" else None)(cluster.get("no-image")), 15,
                      "Failed")
    assert w["reason"] == "ImageNotFound" and "terminal" in w["message"]
    time.sleep(3)
    assert cluster.get("no-image")["restarts"] == 0
    assert "ImageNotFound" in ctl("describe", "workload", "no-image", env=cluster.env).stdout
    ctl("delete", "workload", "no-image", env=cluster.env)
