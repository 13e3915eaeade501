"""Rebalance on `persys dev` (one process: scheduler, two simulated nodes, gateway and the
automation as user:persys-automation): a node at 90 % of its CPU requests (high: 50 %) beside an empty one.
In dry run the policy plans a move to the empty node, checked by the placement engine, within its
per-node budget; enabled, it records the same plan as verified but not executed (the scheduler
has no instance move yet). Also shows the automation running inside `persys dev`."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness import Proc, ctl, eventually, persys, pid_alive

pytestmark = pytest.mark.e2e


def sleeper(name: str) -> str:
    return yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                           "spec": {"type": "process", "resources": {"cpuMillicores": 300, "memoryMb": 16},
                                    "process": {"command": ["sleep", "3600"]}}})


def policy(dry_run: bool) -> str:
    return yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "spread"},
                           "spec": {"dryRun": dry_run, "rebalance": {"lowPercent": 30, "highPercent": 50,
                                                                    "maxMovesPerNode": 1, "intervalSeconds": 1}}})


def test_rebalance_plans_checked_moves(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"nodes": [
        {"name": "hot", "cpuMillicores": 1000, "memoryMb": 2048}, {"name": "cold", "cpuMillicores": 1000,
                                                                    "memoryMb": 2048}]}))
    env = {"PERSYS_HOME": str(tmp_path / "home")}
    dev = Proc("dev", persys("dev", "--port", "0", "--data-dir", str(tmp_path / "data"), "--nodes",
                             str(tmp_path / "nodes.yaml")), tmp_path, env=env)
    try:
        dev.wait_for("Press Ctrl-C to stop", timeout=90)
        assert "automation: running as user:persys-automation" in dev.text()
        ctl("cordon", "cold", env=env)
        for i in range(3):
            ctl("apply", "-f", "-", env=env, stdin=sleeper(f"s{i}"))
        eventually(lambda: all(json.loads(ctl("get", "workload", f"s{i}", "-o", "json", env=env).stdout)["node"]
                               == "hot" for i in range(3)), 60, "three sleepers on hot")
        ctl("uncordon", "cold", env=env)
        ctl("apply", "-f", "-", env=env, stdin=policy(dry_run=True))

        def log(outcome: str) -> list[dict[str, Any]]:
            return json.loads(ctl("automation", "log", "spread", "--outcome", outcome, "-o", "json", env=env).stdout)

        planned, _ = eventually(lambda: log("dry-run"), 30, "a dry-run move")
        move = planned[0]
        assert (move["action"]["type"], move["action"]["from"], move["action"]["to"]) == ("move", "hot", "cold")
        assert move["inputs"]["utilisation"] == {"hot": 90.0, "cold": 0.0}
        assert "placement: placed on cold" in move["reason"]
        # The per-node budget: one move planned, the next candidate held in the same pass.
        same = [d for d in json.loads(ctl("automation", "log", "spread", "-o", "json", env=env).stdout)
                if d["ts"] == move["ts"]]
        assert [d["heldBy"] for d in same] == ["", "budget"], same
        ctl("apply", "-f", "-", env=env, stdin=policy(dry_run=False))
        held, _ = eventually(lambda: [d for d in log("none") if d["heldBy"] == "verify" and d["policyVersion"] == 2],
                             30, "the enabled policy's verified plan")
        assert "not executed" in held[0]["reason"]
        for i in range(3):  # nothing moved
            assert json.loads(ctl("get", "workload", f"s{i}", "-o", "json", env=env).stdout)["node"] == "hot"
        for i in range(3):
            ctl("delete", "workload", f"s{i}", env=env, check=False)
    finally:
        dev.stop()
        for meta in (tmp_path / "data").glob("agents/*/runtimes/process/*/meta.json"):
            pid = json.loads(meta.read_text()).get("pid")
            if pid and pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
