"""Rebalance executed, on `persys dev` (one process: scheduler, two nodes whose agents run real
processes, gateway, and the automation as user:persys-automation).

`hot` (1000m) holds three 300m sleepers (90 %); `cold` (4000m) is empty. First the move API by
hand: a dry run names the engine's node, bad input is a 4xx naming the field, an instance with a
node-local volume is refused. Then an enabled rebalance policy (high 25 %, low 20 %, one move per
pass, three per hour) empties `hot` within that budget: three moves, one per workload, each
stopped on `hot` before it runs on `cold`. Re-applied so that `cold` is now over its threshold
and `hot` under, the policy wants every workload back, and holds each: moved within the hold."""

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


def sleeper(name: str, volume: bool = False) -> str:
    spec: dict[str, Any] = {"type": "process", "resources": {"cpuMillicores": 300, "memoryMb": 16},
                            "process": {"command": ["sleep", "3600"]}}
    if volume:
        spec["volumes"] = [{"name": "data", "mountPath": "/data", "driver": "local", "sizeMb": 1}]
        spec["resources"]["cpuMillicores"] = 10
    return yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                           "spec": spec})


def policy(low: int, high: int) -> str:
    return yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "spread"},
                           "spec": {"rebalance": {"lowPercent": low, "highPercent": high, "maxMovesPerNode": 1,
                                                  "maxMovesPerRun": 1, "maxMovesPerHour": 3, "holdMinutes": 30,
                                                  "intervalSeconds": 1}}})


def pids_on(data: Path, node: str) -> list[int]:
    """The live processes the node's agent started (its process runtime's records)."""
    out = []
    for meta in data.glob(f"agents/{node}/runtimes/process/*/meta.json"):
        pid = json.loads(meta.read_text()).get("pid")
        if pid and pid_alive(pid):
            out.append(pid)
    return out


def test_rebalance_empties_a_node_within_budget_and_hold(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"nodes": [
        {"name": "hot", "cpuMillicores": 1000, "memoryMb": 2048}, {"name": "cold", "cpuMillicores": 4000,
                                                                    "memoryMb": 4096}]}))
    env = {"PERSYS_HOME": str(tmp_path / "home")}
    data = tmp_path / "data"
    dev = Proc("dev", persys("dev", "--port", "0", "--data-dir", str(data), "--nodes",
                             str(tmp_path / "nodes.yaml")), tmp_path, env=env)

    def get(name: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(ctl("get", "workload", name, "-o", "json", env=env).stdout)
        return doc

    def log(outcome: str = "") -> list[dict[str, Any]]:
        extra = ["--outcome", outcome] if outcome else []
        docs: list[dict[str, Any]] = json.loads(ctl("automation", "log", "spread", *extra, "--since", "1h",
                                                    "-o", "json", env=env).stdout)
        return docs

    try:
        dev.wait_for("Press Ctrl-C to stop", timeout=90)
        ctl("cordon", "cold", env=env)
        for i in range(3):
            ctl("apply", "-f", "-", env=env, stdin=sleeper(f"s{i}"))
        ctl("apply", "-f", "-", env=env, stdin=sleeper("pinned", volume=True))
        _, took = eventually(lambda: all(get(n)["node"] == "hot" and get(n)["phase"] == "Running"
                                         for n in ("s0", "s1", "s2", "pinned")), 90, "everything running on hot")
        print(f"placed on hot in {took:.1f}s")
        ctl("uncordon", "cold", env=env)

        # The move API by hand: checked, refused with reasons, nothing written.
        dry = json.loads(ctl("move", "s0/0", "--dry-run", "-o", "json", env=env).stdout)
        assert (dry["from"], dry["to"], dry["dryRun"]) == ("hot", "cold", True), dry
        bad = ctl("move", "s0/s0", "--to", "hot", env=env, check=False)
        assert bad.returncode != 0 and "to:" in bad.stderr + bad.stdout, bad
        odd = ctl("move", "s0/0", "--to", "bad node!", env=env, check=False)
        assert odd.returncode != 0 and "to: node name 'bad node!'" in odd.stderr + odd.stdout, odd
        gone = ctl("move", "s0/7", env=env, check=False)
        assert gone.returncode != 0 and "not found" in (gone.stderr + gone.stdout).lower(), gone
        local = ctl("move", "pinned/0", "--to", "cold", env=env, check=False)
        assert local.returncode != 0 and "node-local volume" in local.stderr + local.stdout, local
        assert get("s0")["node"] == "hot" and get("pinned")["node"] == "hot"
        ctl("delete", "workload", "pinned", env=env)
        eventually(lambda: len(pids_on(data, "hot")) == 3, 60, "the pinned workload gone")

        # The policy empties hot: one move per pass, three in the hour.
        ctl("apply", "-f", "-", env=env, stdin=policy(20, 25))

        def emptied() -> bool:
            return all(get(n)["node"] == "cold" and get(n)["phase"] == "Running" for n in ("s0", "s1", "s2"))

        _, took = eventually(emptied, 180, "hot emptied onto cold")
        print(f"hot emptied in {took:.1f}s")
        assert pids_on(data, "hot") == [], "a moved process still runs on hot"
        assert len(pids_on(data, "cold")) == 3
        acted = log("acted")
        assert sorted(d["action"]["workload"] for d in acted) == ["s0", "s1", "s2"], acted
        assert all((d["action"]["type"], d["action"]["from"], d["action"]["to"]) == ("move", "hot", "cold")
                   for d in acted)
        assert all(d["actor"] == "user:persys-automation" for d in acted)
        assert len({d["ts"] for d in acted}) == 3, "more than one move in a pass (maxMovesPerRun 1)"
        for n in ("s0", "s1", "s2"):
            assert get(n)["instances"][0]["movedAt"] > 0
        events = ctl("events", "--for", "workload/s0", env=env).stdout
        assert "Moving" in events and "Relocated" in events, events

        # cold is now over a lower threshold, hot under: every workload would go back; the hold keeps them.
        ctl("apply", "-f", "-", env=env, stdin=policy(5, 10))
        held, _ = eventually(lambda: [d for d in log("none") if d["policyVersion"] == 2 and d["heldBy"] == "hold"],
                             60, "the moved workloads held")
        assert "moved within the last 30 min" in held[0]["reason"], held[0]
        # A few more passes: still nothing moved twice.
        eventually(lambda: len([d for d in log("none") if d["policyVersion"] == 2 and d["heldBy"] == "hold"]) >= 6,
                   60, "more held passes")
        assert len(log("acted")) == 3
        assert all(get(n)["node"] == "cold" for n in ("s0", "s1", "s2"))
        audit = ctl("audit", "--since", "1h", "-o", "json", env=env).stdout
        moves = [r for r in json.loads(audit) if "MoveInstance" in json.dumps(r)]
        assert any("persys-automation" in json.dumps(r) for r in moves), audit[-2000:]
        for i in range(3):
            ctl("delete", "workload", f"s{i}", env=env, check=False)
    finally:
        dev.stop()
        for meta in data.glob("agents/*/runtimes/process/*/meta.json"):
            pid = json.loads(meta.read_text()).get("pid")
            if pid and pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
