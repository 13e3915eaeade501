"""`kind: Policy` through the real stack (scheduler, gateway, persysctl as OS processes): apply,
get, describe, delete; who may; 400s naming the field with nothing written; the decision log
(recorded by an operator identity, listed by a viewer) and the pause switch."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from persys.client import SchedulerClient
from persys.tlsfiles import TLSFiles
from tests.e2e.harness import ctl, persys
from tests.gateway.cluster import GatewayCluster, start_cluster
from tests.security.role_certs import role_identities

POLICY = {"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "web-cpu"},
          "spec": {"autoscale": {"workload": "web", "target": 50, "maxReplicas": 5}}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayCluster, dict[str, TLSFiles]]]:
    root = tmp_path_factory.mktemp("policies")
    c = start_cluster(root, with_agent=False, scheduler_args=("--metrics-plain-listen", "127.0.0.1:0", "--meter",
                                                              f"duckdb:{root / 'meter.duckdb'}"))
    try:
        yield c, role_identities(c.pki)
    finally:
        c.stop()


def http(c: GatewayCluster, tls: TLSFiles) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(c.pki / "ca.crt"))
    ctx.load_cert_chain(str(tls.cert), str(tls.key))
    return httpx.Client(base_url=c.url, verify=ctx, timeout=30)


def test_apply_get_describe_delete_with_persysctl(cluster: tuple[GatewayCluster, dict[str, TLSFiles]],
                                                  tmp_path: Path) -> None:
    c, _ = cluster
    env = c.ctl_env()
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(POLICY))
    assert "policy/web-cpu created" in ctl("apply", "-f", str(f), env=env).stdout
    assert "policy/web-cpu unchanged" in ctl("apply", "-f", str(f), env=env).stdout  # idempotent
    listed = json.loads(ctl("get", "policies", "-o", "json", env=env).stdout)
    assert [(p["name"], p["sort"], p["version"]) for p in listed] == [("web-cpu", "autoscale", 1)]
    assert "web-cpu" in ctl("get", "policies", env=env).stdout
    changed = {**POLICY, "spec": {"dryRun": True, **POLICY["spec"]}}
    f.write_text(yaml.safe_dump(changed))
    assert "policy/web-cpu configured" in ctl("apply", "-f", str(f), env=env).stdout
    text = ctl("describe", "policy", "web-cpu", env=env).stdout
    assert "Version:   2" in text and "dry run" in text and "maxReplicas: 5" in text
    assert "policy/web-cpu deleted" in ctl("delete", "policy", "web-cpu", env=env).stdout
    assert "already gone" in ctl("delete", "policy", "web-cpu", env=env).stdout
    assert json.loads(ctl("get", "policies", "-o", "json", env=env).stdout) == []


def test_bad_manifests_name_the_field_and_write_nothing(cluster: tuple[GatewayCluster, dict[str, TLSFiles]],
                                                       tmp_path: Path) -> None:
    c, ids = cluster
    with http(c, ids["operator"]) as op:
        bad = {**POLICY, "spec": {"autoscale": {"workload": "web", "target": 50, "maxReplicas": 5, "minReplicas": 9}}}
        r = op.post("/v1/automation/policies", json=bad)
        assert r.status_code == 400 and "spec.autoscale" in r.text and "below minReplicas" in r.text
        r = op.post("/v1/automation/policies", json={**POLICY, "spec": {}})
        assert r.status_code == 400 and "exactly one of" in r.text
        r = op.post("/v1/automation/policies", content=b"{not json")
        assert r.status_code == 400
        assert op.get("/v1/automation/policies").json()["items"] == []
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({**POLICY, "spec": {"autoscale": {"workload": "web", "target": 0, "maxReplicas": 5}}}))
    p = ctl("apply", "-f", str(f), env=c.ctl_env(), check=False)
    assert p.returncode != 0 and "spec.autoscale.target" in p.stderr + p.stdout


def test_who_may(cluster: tuple[GatewayCluster, dict[str, TLSFiles]]) -> None:
    c, ids = cluster
    with http(c, ids["viewer"]) as viewer, http(c, ids["operator"]) as op:
        r = viewer.post("/v1/automation/policies", json=POLICY)
        assert r.status_code == 403 and r.json()["resource"] == "automation-policies"
        assert op.post("/v1/automation/policies", json=POLICY).status_code == 201
        assert viewer.get("/v1/automation/policies/web-cpu").json()["createdBy"] == "user:operator"
        assert viewer.post("/v1/automation/pause").status_code == 403
        assert viewer.delete("/v1/automation/policies/web-cpu").status_code == 403
        assert op.delete("/v1/automation/policies/web-cpu").json() == {"deleted": True, "alreadyGone": False}


def test_decision_log_and_pause(cluster: tuple[GatewayCluster, dict[str, TLSFiles]]) -> None:
    c, ids = cluster
    now = time.time()
    decision = {"ts": now, "policy": "web-cpu", "policyVersion": 1, "sort": "autoscale", "outcome": "none",
                "heldBy": "stabilization", "rawDesired": 2, "desired": 4, "reason": "held",
                "inputs": {"recommendation": 2},
                "evidence": [{"source": "meter", "query": {"selector": "workload", "value": "web"},
                              "start": now - 70, "end": now}]}
    with http(c, ids["viewer"]) as viewer, http(c, ids["operator"]) as op:
        assert op.post("/v1/automation/policies", json=POLICY).status_code == 201
        # The automation records through the client API as an operator identity.
        async def record() -> list[str]:
            client = SchedulerClient(c.scheduler_target, ids["operator"])
            try:
                ids_ = await client.record_decisions([decision, {**decision, "outcome": "acted", "heldBy": "",
                                                                 "action": {"type": "scale", "from": 2, "to": 4}}])
                with pytest.raises(Exception, match="heldBy"):
                    await client.record_decisions([{**decision, "heldBy": "whim"}])
                return ids_
            finally:
                await client.close()

        recorded = asyncio.run(record())
        assert len(recorded) == 2
        log = viewer.get("/v1/automation/decisions", params={"policy": "web-cpu"}).json()
        assert [d["id"] for d in log] == recorded
        assert log[0]["actor"] == "user:operator" and log[0]["evidence"][0]["query"]["value"] == "web"
        assert [d["outcome"] for d in viewer.get("/v1/automation/decisions",
                                                  params={"outcome": "acted"}).json()] == ["acted"]
        assert viewer.get("/v1/automation/decisions", params={"since": "bogus"}).status_code == 400
        out = ctl("automation", "log", "web-cpu", env=c.ctl_env()).stdout
        assert "stabilization" in out and "scale 2->4" in out
        events = viewer.get("/v1/events", params={"subject": "policy/web-cpu"}).json()
        assert {"PolicyCreated", "AutomationActed", "AutomationHeld"} <= {e["kind"] for e in events}
        # The switch: one policy, then all automation.
        op.post("/v1/automation/pause", params={"policy": "web-cpu"}, json={"reason": "maintenance"})
        assert viewer.get("/v1/automation/policies/web-cpu").json()["spec"]["paused"] is True
        assert op.post("/v1/automation/pause", params={"policy": "ghost"}).status_code == 404
        assert "all automation paused" in ctl("automation", "pause", "--reason", "test", env=c.ctl_env()).stdout
        state = viewer.get("/v1/automation/policies").json()["pause"]
        assert state["paused"] is True and state["reason"] == "test"
        ctl("automation", "resume", env=c.ctl_env())
        ctl("automation", "resume", "web-cpu", env=c.ctl_env())
        listing = viewer.get("/v1/automation/policies").json()
        assert listing["pause"]["paused"] is False and listing["items"][0]["spec"]["paused"] is False
        assert listing["items"][0]["version"] == 3  # pause and resume each changed the spec
        # The scheduler counts the decisions it recorded, by sort, outcome and limit.
        m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", c.scheduler.text())
        assert m, c.scheduler.text()[-2000:]
        text = httpx.get(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=10).text
        assert 'persys_automation_decisions_total{sort="autoscale",outcome="acted",held_by="none"} 1' in text
        assert 'persys_automation_decisions_total{sort="autoscale",outcome="none",held_by="stabilization"} 1' in text
        op.delete("/v1/automation/policies/web-cpu")


def test_persys_automation_refuses_to_run_without_its_rights(cluster: tuple[GatewayCluster, dict[str, TLSFiles]]
                                                               ) -> None:
    c, ids = cluster
    p = subprocess.run(persys("automation", "--scheduler", c.scheduler_target, "--tls-dir", str(c.pki), "--name",
                              ids["viewer"].cert.stem), capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "automation cannot run: PERMISSION_DENIED" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    p = subprocess.run(persys("automation", "--scheduler", c.scheduler_target, "--tls-dir", str(c.pki), "--name",
                              "nobody-here"), capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "--tls-dir:" in p.stderr and "not found" in p.stderr, p.stderr


def test_replay_of_scale_to_zero_and_of_a_prometheus_policy(cluster: tuple[GatewayCluster, dict[str, TLSFiles]]
                                                            ) -> None:
    """Replay through persysctl: a scaleToZero policy replays on its activation workload's meter
    history (none here: it stays at zero, as live would); a Prometheus-scaled one is refused,
    naming why, with nothing run."""
    c, _ = cluster
    env = c.ctl_env()
    zero = {"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "web-zero"},
            "spec": {"autoscale": {"workload": "web", "target": 50, "minReplicas": 0, "maxReplicas": 3,
                                   "scaleToZero": {"activationThreshold": 5, "activationWorkload": "front"}}}}
    prom = {"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "web-prom"},
            "spec": {"autoscale": {"workload": "web", "metric": "prometheus", "target": 10, "maxReplicas": 3,
                                   "prometheus": {"url": "http://127.0.0.1:9/metrics", "name": "queue_depth"}}}}
    for doc in (zero, prom):
        ctl("apply", "-f", "-", env=env, stdin=yaml.safe_dump(doc))
    try:
        text = ctl("policy", "replay", "web-zero", "--since", "10m", env=env).stdout
        assert "scale to zero on: workload/front cpu" in text and "replicas:         0..0" in text, text
        rep = json.loads(ctl("policy", "replay", "web-zero", "--since", "10m", "-o", "json", env=env).stdout)
        assert rep["scaleToZero"] and rep["startReplicas"] == 0 and rep["actions"] == 0, rep
        assert rep["activationEvidence"]["value"] == "front" and rep["heldBy"] == {"stale": rep["decisions"]}, rep
        refused = ctl("policy", "replay", "web-prom", "--since", "10m", env=env, check=False)
        assert refused.returncode != 0 and "Prometheus endpoint of its own" in refused.stdout + refused.stderr, refused
        assert "Traceback" not in refused.stderr
    finally:
        for name in ("web-zero", "web-prom"):
            ctl("delete", "policy", name, env=env, check=False)
