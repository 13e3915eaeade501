"""A real Prometheus (Debian's /usr/bin/prometheus) scrapes a cluster of OS processes (etcd,
one scheduler, one agent, the gateway) over their HTTPS metrics endpoints with a viewer
certificate, configured from deploy/prometheus/prometheus.yml and evaluating
deploy/prometheus/persys-rules.yml. After a known sequence (three applies, one workload that
fails terminally, two deletes) PromQL over Prometheus' HTTP API returns exactly the expected
counts. The same cluster's real outputs pass `promtool check metrics`, every series the rules
and the dashboard name exists in them, and the endpoints refuse who may not read."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml

from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.observability.metrics import FAMILIES
from persys.security import peer_names
from persys.security.grpc_tls import secure_channel
from persys.security.pki import ClusterCA
from persys.tlsfiles import TLSFiles
from tests.e2e.harness import REPO, Components, Proc, eventually, kill_process_workloads, process_manifest
from tests.fixtures_infra import EtcdServer, start_etcd

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("prometheus") is None or
                                                  shutil.which("promtool") is None,
                                                  reason="Debian's prometheus package is not installed")]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "persys-rules.yml"
DASHBOARD = DEPLOY / "grafana" / "persys-dashboard.json"
METRICS_URL = r"{who} metrics on {scheme}://127\.0\.0\.1:(\d+)/metrics"
LISTENERS = ("--metrics-listen", "127.0.0.1:0", "--metrics-plain-listen", "127.0.0.1:0")
# Prometheus has no way to report a kernel-chosen port but its log: it says where it listens.
PROM_LISTENING = r'msg="Listening on" address=127\.0\.0\.1:(\d+)'
OK_WORKLOADS = ("m-ok-1", "m-ok-2", "m-ok-3")
BAD_WORKLOAD = "m-bad"


@dataclass
class Scraped:
    c: Components
    etcd: EtcdServer
    prometheus: Proc
    prom_url: str
    viewer: TLSFiles
    ports: dict[str, int]  # scheduler-https, scheduler-http, agent-https, agent-http

    def query(self, promql: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.prom_url}/api/v1/query", params={"query": promql}, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]  # type: ignore[no-any-return]

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if len(result) == 1 else None


def _fetch(url: str, tls: TLSFiles | None = None, server_name: str = "") -> httpx.Response:
    """GET with the client certificate `tls` (if any), verifying the server's role name."""
    if tls is None:
        return httpx.get(url, timeout=10)
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    ctx.load_cert_chain(str(tls.cert), str(tls.key))
    with httpx.Client(verify=ctx, timeout=10) as client:
        return client.get(url, extensions={"sni_hostname": server_name})


def prometheus_config(tmp: Path, viewer: TLSFiles, targets: dict[str, str]) -> Path:
    """The shipped example, pointed at this cluster: its files, its ports, 1 s scrapes."""
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"}
    cfg["rule_files"] = [str(RULES)]
    for job in cfg["scrape_configs"]:
        tls = job["tls_config"]
        tls.update(ca_file=str(viewer.ca), cert_file=str(viewer.cert), key_file=str(viewer.key))
        if job["job_name"] == "persys-agent":
            tls["server_name"] = peer_names.node("n1")
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    subprocess.run(["promtool", "check", "config", str(path)], check=True, capture_output=True, timeout=60)
    return path


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    tmp = tmp_path_factory.mktemp("prom-e2e")
    etcd = start_etcd(tmp / "etcd")
    c = Components(tmp, etcd.url, scheduler_args=LISTENERS, agent_args=LISTENERS)
    prom: Proc | None = None
    try:
        ports = {f"{who}-{scheme}": int(proc.wait_for_match(METRICS_URL.format(who=who, scheme=scheme)).group(1))
                 for who, proc in (("scheduler", c.scheduler), ("agent", c.agents["n1"]))
                 for scheme in ("https", "http")}
        viewer = ClusterCA(c.pki).issue("prometheus", "user:prometheus", groups=("persys:viewers",),
                                        out=tmp / "prometheus-tls")
        cfg = prometheus_config(tmp, viewer, {"persys-scheduler": f"127.0.0.1:{ports['scheduler-https']}",
                                              "persys-agent": f"127.0.0.1:{ports['agent-https']}",
                                              "persys-gateway": f"127.0.0.1:{c.gw_port}"})
        prom = Proc("prometheus", ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                   "--web.listen-address=127.0.0.1:0", "--storage.tsdb.retention.time=1h"], tmp)
        prom_port = int(prom.wait_for_match(PROM_LISTENING, timeout=60).group(1))
        yield Scraped(c, etcd, prom, f"http://127.0.0.1:{prom_port}", viewer, ports)
    finally:
        if prom is not None:
            prom.stop()
        c.stop()
        kill_process_workloads(tmp)
        etcd.stop()


def _apply(s: Scraped, name: str, manifest: str) -> None:
    path = s.c.tmp / f"{name}.yaml"
    path.write_text(manifest)
    s.c.ctl("apply", "-f", str(path))


@pytest.fixture(scope="module")
def sequence(scraped: Scraped) -> Scraped:
    """Three applies, one that fails terminally (its command does not exist), two deletes. The
    phases are awaited through Prometheus itself (no persysctl polling)."""
    s = scraped
    for name in OK_WORKLOADS:
        _apply(s, name, process_manifest(name, cpu=10))
    _apply(s, BAD_WORKLOAD, process_manifest(BAD_WORKLOAD, cpu=10).replace('"sleep", "3600"',
                                                                          '"/nonexistent/persys-cmd"'))
    eventually(lambda: s.value('persys_workloads{phase="Running"}') == 3
               and s.value('persys_workloads{phase="Failed"}') == 1, timeout=60, what="3 running, 1 failed")
    for name in OK_WORKLOADS[:2]:
        s.c.ctl("delete", "workload", name)  # waits until the agent removed it and the keys are gone
    return s


# PromQL -> the value it must reach exactly. Scheduler series come from its HTTPS listener, the
# agent's from its own, the gateway's from its API, all through Prometheus.
EXPECTED: dict[str, float] = {
    'sum(persys_grpc_server_requests_total{job="persys-scheduler",method="ApplyWorkload",code="OK"})': 4,
    'sum(persys_grpc_server_requests_total{job="persys-scheduler",method="DeleteWorkload",code="OK"})': 2,
    'sum(persys_http_requests_total{route="/v1/workloads",method="POST",status=~"2.."})': 4,
    'sum(persys_http_requests_total{route="/v1/workloads/{workload_id}",method="DELETE"})': 2,
    'persys_placements_total{result="placed"}': 4,
    'persys_workloads{phase="Running"}': 1,
    'persys_workloads{phase="Failed"}': 1,
    'persys_workloads_desired{state="Running"}': 2,
    'persys_workloads_desired{state="Deleting"}': 0,
    'persys_nodes{status="Ready",cordoned="false"}': 1,
    "persys_scheduler_active": 1,
    'persys_agent_runtime_operations_total{runtime="process",operation="start",result="ok"}': 3,
    'persys_agent_runtime_operations_total{runtime="process",operation="start",result="terminal_error"}': 1,
    'persys_agent_runtime_operations_total{runtime="process",operation="remove",result="ok"}': 2,
    'persys_agent_instances{runtime="process"}': 1,
    "persys_agent_connected": 1,
    # the recording rules, evaluated by Prometheus over the scraped series
    'persys:workloads:by_phase{phase="Running"}': 1,
    'persys:nodes:by_status{status="Ready"}': 1,
}


def test_prometheus_counts_match_the_sequence(sequence: Scraped) -> None:
    s = sequence
    seen: dict[str, float | None] = {}

    def all_match() -> bool | None:
        seen.update({q: s.value(q) for q in EXPECTED})
        return all(seen[q] == v for q, v in EXPECTED.items()) or None

    try:
        eventually(all_match, timeout=60, what="Prometheus' values")
    except AssertionError:
        differ = {q: (seen.get(q), v) for q, v in EXPECTED.items() if seen.get(q) != v}
        raise AssertionError(f"PromQL values (got, expected) differ: {differ}") from None
    assert s.query('persys_reconcile_total{result!="ok"} > 0') == []
    assert s.value('up{job="persys-scheduler"}') == 1 and s.value('up{job="persys-gateway"}') == 1
    # Histograms have only bounded labels: one series per method, not per caller or object.
    buckets = s.query('count by (method) (persys_grpc_server_request_duration_seconds_bucket{method="ApplyWorkload"})')
    assert len(buckets) == 1
    rules = httpx.get(f"{s.prom_url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    broken = [(r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r["health"] == "err"]
    assert broken == [], "every shipped rule evaluates against the real series"
    alerts = httpx.get(f"{s.prom_url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    assert not [a for a in alerts if a["labels"]["alertname"] == "PersysNoActiveReplica"]


def _outputs(s: Scraped) -> dict[str, str]:
    gateway = _fetch(f"https://127.0.0.1:{s.c.gw_port}/metrics", s.viewer, peer_names.GATEWAY)
    gateway.raise_for_status()
    return {"scheduler": httpx.get(f"http://127.0.0.1:{s.ports['scheduler-http']}/metrics", timeout=10).text,
            "agent": httpx.get(f"http://127.0.0.1:{s.ports['agent-http']}/metrics", timeout=10).text,
            "gateway": gateway.text}


def test_promtool_accepts_every_process_output_and_the_rules(sequence: Scraped) -> None:
    for who, text in _outputs(sequence).items():
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), f"{who}: {r.stdout}{r.stderr}"
        assert "persys_" in text
    r = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _names_in(expr: str) -> set[str]:
    return set(re.findall(r"\bpersys_[a-z0-9_]+", expr))


def test_rules_and_dashboard_name_only_real_series(sequence: Scraped) -> None:
    exposed: set[str] = set()
    for text in _outputs(sequence).values():
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                name, kind = line.split()[2:4]
                parts = ("_bucket", "_sum", "_count") if kind == "histogram" else ()
                exposed |= {name} | {name + p for p in parts}
    # Per-instance usage families appear only while an instance reports usage (scrape-time
    # gauges with no sample print nothing): on a busy machine the scrape may fall between
    # reports, so those count as exposed when the catalogue declares them.
    exposed |= {f.name for f in FAMILIES.values() if f.name.startswith("persys_workload_") and f.labels}
    rules = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {r["record"] for g in rules for r in g["rules"] if "record" in r}
    used = {n for g in rules for r in g["rules"] for n in _names_in(r["expr"])}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs, "the dashboard has panels with queries"
    for expr in exprs:
        used |= _names_in(expr)
        assert all(r in recorded for r in re.findall(r"\bpersys:[a-z0-9_:]+", expr)), expr
    assert used - exposed == set(), "series named by the rules or the dashboard that no process exposes"


def _refused_list_workloads(target: str, tls: TLSFiles) -> grpc.StatusCode:
    async def call() -> grpc.StatusCode:
        async with secure_channel(target, tls, expect=peer_names.SCHEDULER) as ch:
            try:
                await pb_grpc.AgentControlStub(ch).ListWorkloads(pb.ListRequest(), timeout=10)
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    return asyncio.run(call())


def test_endpoints_refuse_who_may_not_read(sequence: Scraped) -> None:
    s = sequence
    url = f"https://127.0.0.1:{s.ports['scheduler-https']}/metrics"
    pki = s.c.pki
    node = TLSFiles(pki / "ca.crt", pki / "node-n1.crt", pki / "node-n1.key")
    assert _fetch(url, s.viewer, peer_names.SCHEDULER).status_code == 200
    refused = _fetch(url, node, peer_names.SCHEDULER)
    assert refused.status_code == 403 and "get on metrics" in refused.text
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    with pytest.raises(httpx.HTTPError), httpx.Client(verify=ctx, timeout=10) as anonymous:
        anonymous.get(url, extensions={"sni_hostname": peer_names.SCHEDULER})  # no certificate: no handshake
    gw = f"https://127.0.0.1:{s.c.gw_port}/metrics"
    with httpx.Client(verify=ctx, timeout=10) as anonymous:
        assert anonymous.get(gw, extensions={"sni_hostname": peer_names.GATEWAY}).status_code == 401
    assert _fetch(gw, node, peer_names.GATEWAY).status_code == 403
    # The agent's HTTPS listener is scraped by Prometheus (above); its role check is the same.
    assert _fetch(f"https://127.0.0.1:{s.ports['agent-https']}/metrics", node,
                  peer_names.node("n1")).status_code == 403
    # The gRPC interceptor counts what authorization refuses, with its code.
    assert _refused_list_workloads(s.c.replica_targets[0], node) == grpc.StatusCode.PERMISSION_DENIED
    denied = 'persys_grpc_server_requests_total{service="persys.v1.AgentControl",method="ListWorkloads",' \
        'code="PERMISSION_DENIED"} 1'
    eventually(lambda: denied in httpx.get(f"http://127.0.0.1:{s.ports['scheduler-http']}/metrics",
                                           timeout=10).text, timeout=10, what="the refusal counted")
    # A stray path on the plain listener names nothing.
    assert httpx.get(f"http://127.0.0.1:{s.ports['scheduler-http']}/other", timeout=10).status_code == 404
