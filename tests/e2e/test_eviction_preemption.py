"""Through persysctl on a 3-node `persys dev` cluster (examples/dev-3-nodes.yaml: `big` zone a,
`gpu` tainted, `tiny` zone c with 500m): a NoExecute taint moves an untolerating workload off at
once and a tolerating one after its tolerationSeconds; a higher priority preempts a lower one on
the node it needs, and says so (events, explain)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.harness import REPO, ctl, eventually, process_manifest, start_dev

pytestmark = pytest.mark.e2e


def manifest(name: str, extra: str = "", cpu: int = 100) -> str:
    return process_manifest(name, cpu=cpu, memory=64, extra=extra)


SECONDS = 6
TOLERATES = f"  tolerations: [{{key: maint, operator: Exists, effect: NoExecute, tolerationSeconds: {SECONDS}}}]\n"
ZONE_C = "  nodeSelector: {zone: c}\n"


def test_no_execute_eviction_and_preemption(tmp_path: Path) -> None:
    dev, env = start_dev(tmp_path, "--nodes", str(REPO / "examples/dev-3-nodes.yaml"))
    applied: list[str] = []

    def view(name: str) -> dict:  # type: ignore[type-arg]
        return json.loads(ctl("get", "workloads", name, "-o", "json", env=env).stdout)  # type: ignore[no-any-return]

    def running_on(name: str, node: str) -> bool:
        w = view(name)
        return bool(w["phase"] == "Running" and w["node"] == node)

    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=120)
        ctl("cordon", "tiny", env=env)  # both start on big
        ctl("apply", "-f", "-", env=env, stdin=manifest("plain"))
        ctl("apply", "-f", "-", env=env, stdin=manifest("patient", TOLERATES))
        applied += ["plain", "patient"]
        eventually(lambda: running_on("plain", "big") and running_on("patient", "big"), 20, "both on big")
        ctl("uncordon", "tiny", env=env)

        tainted = time.monotonic()
        ctl("taint", "node", "big", "maint=yes:NoExecute", env=env)
        eventually(lambda: running_on("plain", "tiny"), 20, "plain moved off big at once")
        if time.monotonic() - tainted < SECONDS - 1:
            assert view("patient")["node"] == "big", "tolerated for its tolerationSeconds"
        eventually(lambda: running_on("patient", "tiny"), 30, "patient moved off after its tolerationSeconds")
        assert time.monotonic() - tainted >= SECONDS - 0.5
        events = json.loads(ctl("events", "--kind", "Relocating", "-o", "json", env=env).stdout)
        assert {e["message"].split(":")[0] for e in events if e["reason"] == "TaintEviction"} >= {"plain", "patient"}
        ctl("taint", "node", "big", "maint-", env=env)
        for name in ("plain", "patient"):
            ctl("delete", "workload", name, env=env)
        applied.clear()

        # tiny has 500m: low takes 400m; urgent needs 400m there too and has a higher priority.
        ctl("apply", "-f", "-", env=env, stdin=manifest("low", ZONE_C, cpu=400))
        applied.append("low")
        eventually(lambda: running_on("low", "tiny"), 20, "low Running on tiny")
        ctl("apply", "-f", "-", env=env, stdin=manifest("urgent", ZONE_C + "  priority: 100\n", cpu=400))
        applied.append("urgent")
        eventually(lambda: running_on("urgent", "tiny"), 30, "urgent Running on tiny")
        low = view("low")
        assert low["phase"] == "Pending" and low["node"] == "", low
        assert "preempted low (priority 0) on tiny" in ctl("explain", "urgent", env=env).stdout
        kinds = {e["kind"]: e["message"] for e in json.loads(ctl("events", "-o", "json", env=env).stdout)}
        assert kinds["Preempted"] == "low: preempted on tiny by urgent (priority 100)"
    finally:
        for name in applied:  # persys dev leaves running workloads alone when it stops: remove ours
            ctl("delete", "workload", name, env=env, check=False)
        dev.stop(signal.SIGINT)
