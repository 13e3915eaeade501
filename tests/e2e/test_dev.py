"""`persys dev`: the all-in-one cluster on embedded defaults, as a user starts it."""

from __future__ import annotations

import getpass
import json
import re
import secrets
import signal
import time
from pathlib import Path

import docker
import pytest
import yaml
from cryptography import x509

from persys.security.cluster_id import cluster_id_of_file
from persys.security.identity import Kind, from_certificate
from tests.e2e.harness import REPO, Proc, ctl, epoch, eventually, persys, pid_alive
from tests.fixtures_infra import free_port

pytestmark = pytest.mark.e2e


def start_dev(home: Path) -> tuple[Proc, float]:
    """persys dev with its API on a port the kernel picks (the banner names it)."""
    t0 = time.monotonic()
    p = Proc("dev", persys("dev", "--port", "0", "--node-id", "dev-e2e"), home, env={"PERSYS_HOME": str(home)})
    p.wait_for("Press Ctrl-C to stop.", timeout=120)
    return p, time.monotonic() - t0


def test_dev_cluster_end_to_end(tmp_path: Path, docker_engine: object) -> None:
    # The container's published host port is bound by dockerd, not by us: still picked here.
    home, http_port = tmp_path / "home", free_port()
    home.mkdir()
    env = {"PERSYS_HOME": str(home)}
    dev, startup = start_dev(home)
    reported = float(re.search(r"ready in ([0-9.]+)s", dev.text()).group(1))  # type: ignore[union-attr]
    print(f"persys dev ready: {reported:.2f}s reported, {startup:.2f}s including interpreter start")
    api = re.search(r"API:\s+https://127\.0\.0\.1:(\d+)", dev.text())
    assert api and int(api.group(1)) > 0, dev.text()
    runtimes = re.search(r"node:\s+dev-e2e \(runtimes: ([^)]*)\)", dev.text()).group(1).split(", ")  # type: ignore[union-attr]
    assert {"container", "process"} <= set(runtimes)
    # persysctl gets the local user's admin identity, in a folder with no other key (no CA key).
    cfg = yaml.safe_load((home / "config.yaml").read_text())
    assert sorted(p.name for p in Path(cfg["key"]).parent.iterdir()) == ["ca.crt", "user.crt", "user.key"]
    who = from_certificate(x509.load_pem_x509_certificate(Path(cfg["cert"]).read_bytes()))
    assert (who.kind, who.name, who.groups) == (Kind.USER, getpass.getuser(), ("persys:admins",))
    _intelligence_over_grpc(dev.text(), cfg)
    try:
        ctl("apply", "-f", str(REPO / "examples/hello-process.yaml"), env=env)
        manifest = (REPO / "examples/hello-docker.yaml").read_text().replace("18080", str(http_port))
        ctl("apply", "-f", "-", env=env, stdin=manifest)
        running = lambda name: (lambda w: w if w["phase"] == "Running" else None)(  # noqa: E731
            json.loads(ctl("get", "workloads", name, "-o", "json", env=env).stdout))
        proc_w, t1 = eventually(lambda: running("hello-process"), 10, "hello-process Running")
        cont_w, t2 = eventually(lambda: running("hello-docker"), 10, "hello-docker Running")
        print(f"apply-to-Running under persys dev: process {t1:.2f}s, container {t2:.2f}s")
        assert proc_w["node"] == cont_w["node"] == "dev-e2e"
        _one_exposition_for_every_component(cfg)
        pid = int(proc_w["runtimeId"])

        # Secrets need no set-up either (built-in store, its key made on first start): the value
        # reaches the workload and no file of the control plane or the agent holds it.
        value = secrets.token_hex(12)
        example = (REPO / "examples/hello-secret.yaml").read_text().replace("change-me", value)
        probe = example.replace('echo \\"password has', 'echo \\"got:$DB_PASSWORD; has')  # show the value itself
        ctl("apply", "-f", "-", env=env, stdin=probe)
        eventually(lambda: f"got:{value}" in ctl("logs", "hello-secret", env=env).stdout, 15,
                   "the secret in the workload")
        assert "password" in ctl("get", "secret", "hello-db", "-o", "json", env=env).stdout
        shown = ctl("get", "secret", "hello-db", "-o", "json", env=env).stdout + ctl(
            "get", "workloads", "hello-secret", "-o", "json", env=env).stdout + dev.text()
        stores = [p for p in home.rglob("*.db*") if p.is_file()]
        assert stores and value not in shown and all(value.encode() not in p.read_bytes() for p in stores)
        ctl("delete", "workload", "hello-secret", env=env)

        # Ctrl-C stops the control plane cleanly; the restart finds the same state.
        dev.stop(signal.SIGINT)
        assert dev.proc is not None and dev.proc.returncode == 0, dev.text()[-2000:]
        assert pid_alive(pid)
        stopped_at = time.time()
        dev, _ = start_dev(home)
        names = {w["name"]: w for w in json.loads(ctl("get", "workloads", "-o", "json", env=env).stdout)}
        assert set(names) == {"hello-process", "hello-docker"}
        # The event history survived the restart (a bounded SQLite log, not an in-memory ring).
        history = json.loads(ctl("events", "--limit", "500", "-o", "json", env=env).stdout)
        assert [e for e in history if e["subject"] == "workload/hello-process" and epoch(e["ts"]) < stopped_at], history
        w, _ = eventually(lambda: running("hello-process"), 10, "still Running after restart")
        assert int(w["runtimeId"]) == pid and w["restarts"] == 0

        ctl("delete", "workload", "hello-process", env=env)
        ctl("delete", "workload", "hello-docker", env=env)
        assert not pid_alive(pid)
        # This cluster's container only: other suites on the engine may run a hello-docker of theirs.
        ours = ["persys.workload=hello-docker", f"persys.cluster={cluster_id_of_file(home / 'dev' / 'pki' / 'ca.crt')}"]
        assert docker.from_env().containers.list(all=True, filters={"label": ours}) == []
    finally:
        dev.stop(signal.SIGINT)


def _one_exposition_for_every_component(cfg: dict[str, str]) -> None:
    """The README points at persys dev's /metrics: it serves the scheduler's, the agent's (labelled
    with its node) and the gateway's series as one valid exposition (it had the gateway's alone)."""
    import ssl

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    ctx = ssl.create_default_context(cafile=cfg["ca"])
    ctx.load_cert_chain(cfg["cert"], cfg["key"])
    with httpx.Client(verify=ctx, timeout=30) as http:
        text = http.get(f"{cfg['server']}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}  # raises on a malformed one
    for name in ("persys_http_requests", "persys_placements", "persys_nodes", "persys_store_operations",
                 "persys_reconcile", "persys_agent_passes", "persys_agent_runtime_operations"):
        assert name in families, sorted(families)
    assert {s.labels.get("node") for s in families["persys_agent_passes"].samples} == {"dev-e2e"}
    assert sum(line.startswith("# TYPE process_cpu_seconds_total ") for line in text.splitlines()) == 1


def _intelligence_over_grpc(banner: str, cfg: dict) -> None:  # type: ignore[type-arg]
    """persys dev serves Persys Intelligence over gRPC too (the banner names the port)."""
    import grpc

    from persys._pb.persys.v1 import intelligence_pb2 as ipb
    from persys._pb.persys.v1 import intelligence_pb2_grpc as ipb_grpc

    m = re.search(r"gRPC persys\.v1\.Intelligence on 127\.0\.0\.1:(\d+)", banner)
    assert m, banner
    creds = grpc.ssl_channel_credentials(Path(cfg["ca"]).read_bytes(), Path(cfg["key"]).read_bytes(),
                                         Path(cfg["cert"]).read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{m.group(1)}", creds) as ch:
        answer = ipb_grpc.IntelligenceStub(ch).WhyCluster(ipb.WhyRequest(), timeout=60)
    assert json.loads(answer.json)["subject"] == "cluster"
