"""Remediation on real processes (scheduler, agent with the process runtime, gateway): a node
whose runtime fails three workloads in a row is cordoned once, by the automation's identity;
uncordoned by an operator, it is left alone (the decision says `hold`), not cordoned again. A
workload whose instance fails is restarted once, then held for the failure window.

The loop runs in this test process (as `persys automation` would), with its own operator
certificate, against the real scheduler."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.automation.loop import AutomationLoop
from persys.client import SchedulerClient
from tests.e2e.harness import ctl, eventually
from tests.gateway.cluster import ready_cluster
from tests.security.role_certs import issue_user

pytestmark = pytest.mark.e2e


def broken(name: str) -> str:
    return yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                           "spec": {"type": "process", "restartPolicy": "Never",
                                    "process": {"command": ["/nonexistent/persys-remediate-test"]}}})


def test_a_failing_node_is_cordoned_once(tmp_path: Path) -> None:
    with ready_cluster(tmp_path) as c:
        env = c.ctl_env()
        tls = issue_user(c.pki, "persys-automation", ("persys:operators",))
        policy = {"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "heal"},
                  "spec": {"remediate": {"cordonAfterFailures": 3, "restartUnhealthy": False,
                                         "intervalSeconds": 1}}}
        ctl("apply", "-f", "-", env=env, stdin=yaml.safe_dump(policy))
        for i in range(3):
            ctl("apply", "-f", "-", env=env, stdin=broken(f"broken-{i}"))
        eventually(lambda: len(json.loads(ctl("events", "--kind", "WorkloadFailed", "--node", "n1", "-o", "json",
                                              env=env).stdout)) >= 3, 60,
                   "three WorkloadFailed events naming n1")

        async def passes(until: str, limit: int = 200) -> list[dict[str, Any]]:
            client = SchedulerClient(c.scheduler_target, tls)
            loop = AutomationLoop(client)
            seen: list[dict[str, Any]] = []
            try:
                for _ in range(limit):
                    seen += await loop.run_once()
                    if any(d.get("heldBy") == until or (d.get("outcome") == until) for d in seen):
                        return seen
                    await asyncio.sleep(0.2)  # the policy's 1 s interval: a pass decides only when due
            finally:
                await client.close()
            raise AssertionError(f"no {until} decision in {limit} passes: {seen}")

        acted = asyncio.run(passes("acted"))
        cordons = [d for d in acted if d["outcome"] == "acted"]
        assert [(d["action"]["type"], d["action"]["target"]) for d in cordons] == [("cordon", "n1")]
        assert len([e for e in cordons[0]["evidence"] if e["ref"]]) >= 3  # the events it counted
        assert c.client().get("/v1/nodes/n1").json()["cordoned"] is True
        audit = json.loads(ctl("audit", "--who", "persys-automation", "-o", "json", env=env).stdout)
        assert [a["action"].rsplit("/", 1)[1] for a in audit] == ["CordonNode"]

        ctl("uncordon", "n1", env=env)  # the operator's word
        held = asyncio.run(passes("hold"))  # a new loop: what it did comes back from the log
        assert not [d for d in held if d["outcome"] == "acted"]
        assert c.client().get("/v1/nodes/n1").json()["cordoned"] is False
        log = json.loads(ctl("automation", "log", "heal", "--outcome", "acted", "-o", "json", env=env).stdout)
        assert len(log) == 1
        for i in range(3):
            ctl("delete", "workload", f"broken-{i}", env=env, check=False)


def test_a_failed_workload_is_restarted_once_per_window(tmp_path: Path) -> None:
    with ready_cluster(tmp_path) as c:
        env = c.ctl_env()
        tls = issue_user(c.pki, "persys-automation", ("persys:operators",))
        policy = {"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "heal"},
                  "spec": {"remediate": {"cordonAfterFailures": 100, "restartUnhealthy": True,
                                         "failureWindowSeconds": 600, "intervalSeconds": 1}}}
        ctl("apply", "-f", "-", env=env, stdin=yaml.safe_dump(policy))
        failing = yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "flaky"},
                                  "spec": {"type": "process", "restartPolicy": "Never",
                                           "process": {"command": ["sh", "-c", "exit 3"]}}})
        ctl("apply", "-f", "-", env=env, stdin=failing)
        eventually(lambda: c.client().get("/v1/workloads/flaky").json()["phase"] == "Failed", 60, "flaky Failed")
        before = c.client().get("/v1/workloads/flaky").json()["revision"]

        async def run(passes: int) -> list[dict[str, Any]]:
            client = SchedulerClient(c.scheduler_target, tls)
            loop = AutomationLoop(client)
            seen: list[dict[str, Any]] = []
            try:
                for _ in range(passes):
                    seen += await loop.run_once()
                    if any(d["heldBy"] == "hold" for d in seen):
                        break
                    await asyncio.sleep(0.2)
            finally:
                await client.close()
            return seen

        seen = asyncio.run(run(300))
        acted = [d for d in seen if d["outcome"] == "acted"]
        assert [(d["action"]["type"], d["action"]["target"]) for d in acted] == [("restart", "flaky")], seen
        assert c.client().get("/v1/workloads/flaky").json()["revision"] == f"{before}-1"  # restarted once
        assert any(d["heldBy"] == "hold" and "restarted within" in d["reason"] for d in seen)
        audit = json.loads(ctl("audit", "--who", "persys-automation", "-o", "json", env=env).stdout)
        assert [a["action"].rsplit("/", 1)[1] for a in audit] == ["ControlWorkload"]
        ctl("delete", "workload", "flaky", env=env, check=False)
