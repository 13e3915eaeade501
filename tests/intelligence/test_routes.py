"""The intelligence REST routes against a real scheduler and gateway (OS processes): answers and
refusals naming the parameter, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.harness import ctl
from tests.gateway.cluster import start_cluster

pytestmark = pytest.mark.e2e


def test_routes_answer_and_refuse_bad_input(tmp_path: Path) -> None:
    c = start_cluster(tmp_path, with_agent=False)
    try:
        with c.client() as http:
            assert http.get("/v1/why/workloads/ghost").status_code == 404
            r = http.get("/v1/why/cluster").json()
            assert r["subject"] == "cluster" and "evidence" in r and r["lookedAt"]
            assert r["evidence"]["documents"][0]["kind"] == "health"
            for path, params, field in (
                    ("/v1/forecast/cluster", {"metric": "gpu"}, "metric"),
                    ("/v1/forecast/cluster", {"since": "1h", "horizon": "2h"}, "horizon"),
                    ("/v1/forecast/cluster", {"since": "soon"}, "since"),
                    ("/v1/rightsize/workloads/ghost", {"since": "-1d"}, "since")):
                bad = http.get(path, params=params)
                assert bad.status_code == 400 and bad.json()["error"].startswith(field), (path, bad.text)
            ins = http.get("/v1/insights")
            assert ins.status_code == 200 and ins.json()["recommendations"] == []
            fc = http.get("/v1/forecast/cluster", params={"since": "1h", "horizon": "10m"}).json()
            assert fc["verdict"] == "insufficient history" and fc["unpredictable"]
            narrated = http.get("/v1/why/cluster", params={"narrate": "true"}).json()
            assert narrated["narration"] == {"enabled": False}
            assert http.get("/v1/workloads").json() == []  # nothing was written
            # Rightsizing warns when an automation policy scales the same workload on the same metric.
            web = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "web"},
                   "spec": {"type": "process", "resources": {"cpuMillicores": 200, "memoryMb": 32},
                            "process": {"command": ["sleep", "60"]}}}
            assert http.post("/v1/workloads", json=web).status_code in (200, 201)
            before = http.get("/v1/rightsize/workloads/web").json()
            assert before["warnings"] == [], before
            policy = {"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "web-cpu"},
                      "spec": {"dryRun": True, "autoscale": {"workload": "web", "metric": "cpu", "target": 50,
                                                            "minReplicas": 1, "maxReplicas": 3}}}
            assert http.post("/v1/automation/policies", json=policy).status_code == 201
            after = http.get("/v1/rightsize/workloads/web").json()
            assert [(w["policy"], w["metric"], w["dryRun"]) for w in after["warnings"]] == [("web-cpu", "cpu", True)]
            assert "policy/web-cpu@v1" in after["evidence"] and "scales this workload on cpu" in \
                after["warnings"][0]["message"]
            listed = http.get("/v1/automation/policies").json()["items"]
            assert [p["name"] for p in listed] == ["web-cpu"] and listed[0]["version"] == 1  # read, not changed
            # Every investigation answered is on record, the inconclusive ones too, with what they read.
            kept = http.get("/v1/investigations", params={"inconclusive": "true"}).json()
            assert kept and kept[0]["subject"] == "cluster" and kept[0]["lookedAt"] and kept[0]["first"] is None
            assert kept[0]["askedBy"] == "user:admin" and kept[0]["id"] == narrated["record"]
        env = c.ctl_env()
        text = ctl("why", "cluster", env=env).stdout
        assert text.startswith("why cluster") and "inconclusive" in text
        gone = ctl("why", "ghost", env=env, check=False)
        assert gone.returncode != 0 and "ghost" in gone.stdout + gone.stderr
        assert "persysctl why node n1" in ctl("why", "--help", env=env).stdout
    finally:
        c.stop()
