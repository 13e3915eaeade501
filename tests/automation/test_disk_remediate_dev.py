"""Relocating off a node whose disk is filling, on `persys dev` (one process: scheduler with its
DuckDB meter, two nodes whose agents run real processes, gateway, and the automation as
user:persys-automation with its disk forecasts source, automation/disk_forecasts.py).

Both nodes' agents report the bytes used on this machine's filesystem (their state folders share
it); what differs is the disk they advertise: `full` says the filesystem is a little larger than
what is used now (93 %), `roomy` says 10 TiB. A process on `full` appends 16 MiB a second to a
file (at most 6 GiB), a sleeper keeps it company. Intelligence's forecast of `full`'s used disk,
read from the real meter, reaches 95 % within six minutes: a remediate policy in dryRun records the
cordon and the relocation and does neither (and consumes no rate: its first enabled pass acts);
enabled, it cordons `full` and moves one instance to `roomy`, then holds the other by its rate
(two actions an hour), every decision in `persysctl automation log` citing the meter series the
forecast read."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness import Proc, ctl, eventually, persys, pid_alive

pytestmark = pytest.mark.e2e
MIB = 2**20
FILL_LIMIT = 6 * 1024 * MIB
RATE_MIB = 16  # a second: ~160 MiB a meter step, well above what other writers on the machine add


def workload(name: str, command: list[str]) -> str:
    return yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                           "spec": {"type": "process", "resources": {"cpuMillicores": 100, "memoryMb": 16},
                                    "process": {"command": command}}})


def policy(dry_run: bool) -> str:
    return yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "disk"},
                           "spec": {"dryRun": dry_run, "remediate": {
                               "cordonAfterFailures": 1000, "restartUnhealthy": False, "maxActionsPerHour": 2,
                               "intervalSeconds": 2,
                               # Six minutes of 10 s samples; the point forecast six minutes ahead.
                               "relocateOnDiskFilling": {"withinHours": 0.1, "fullPercent": 95, "historyHours": 0.1,
                                                         "bound": "point"}}}})


def test_a_filling_node_is_emptied_within_the_rate_and_a_dry_run_moves_nothing(tmp_path: Path) -> None:
    # Outside tmp_path (0700): the process runtime runs each workload as a uid of its own, which
    # must reach the file; the file outlives a move, so the bound is on what is written in all.
    fill = Path(tempfile.mkdtemp(prefix="persys-test-fill-", dir="/tmp"))
    fill.chmod(0o777)
    used_mib = shutil.disk_usage(tmp_path).used // MIB
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"nodes": [
        {"name": "full", "cpuMillicores": 2000, "memoryMb": 2048, "diskMb": int(used_mib / 0.93)},
        {"name": "roomy", "cpuMillicores": 2000, "memoryMb": 2048, "diskMb": 10 * 1024 * 1024}]}))
    env = {"PERSYS_HOME": str(tmp_path / "home")}
    data = tmp_path / "data"
    dev = Proc("dev", persys("dev", "--port", "0", "--data-dir", str(data), "--nodes",
                             str(tmp_path / "nodes.yaml")), tmp_path, env=env)
    writer = (f"umask 0; f={fill / 'data'}; while [ $(stat -c %s $f 2>/dev/null || echo 0) -lt {FILL_LIMIT} ]; do "
              f"head -c {RATE_MIB * MIB} /dev/zero >> $f; sleep 1; done; exec sleep 3600")

    def get(name: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(ctl("get", "workload", name, "-o", "json", env=env).stdout)
        return doc

    def log(outcome: str = "") -> list[dict[str, Any]]:
        extra = ["--outcome", outcome] if outcome else []
        docs: list[dict[str, Any]] = json.loads(ctl("automation", "log", "disk", *extra, "--since", "1h",
                                                    "-o", "json", env=env).stdout)
        return docs

    def cordoned(node: str) -> bool:
        return bool(json.loads(ctl("get", "node", node, "-o", "json", env=env).stdout).get("cordoned"))

    try:
        dev.wait_for("Press Ctrl-C to stop", timeout=120)
        ctl("cordon", "roomy", env=env)
        ctl("apply", "-f", "-", env=env, stdin=workload("filler", ["sh", "-c", writer]))
        ctl("apply", "-f", "-", env=env, stdin=workload("idle", ["sleep", "3600"]))
        eventually(lambda: all(get(n)["node"] == "full" and get(n)["phase"] == "Running" for n in ("filler", "idle")),
                   120, "both running on full")
        ctl("uncordon", "roomy", env=env)
        _, took = eventually(lambda: (fill / "data").exists() and (fill / "data").stat().st_size >= 64 * MIB, 120,
                             "the filler writing")
        print(f"\nthe filler wrote 64 MiB {took:.1f} s after both ran")

        # Dry run: decides (cordon, relocate) and records, moves nothing.
        ctl("apply", "-f", "-", env=env, stdin=policy(dry_run=True))
        try:
            dry, took = eventually(lambda: [d for d in log("dry-run") if (d.get("action") or {}).get("type")
                                            == "relocate"], 360, "a dry-run relocation off full")
        except AssertionError:
            print([(d["outcome"], d["inputs"], d["reason"]) for d in log()[-5:]])  # what it did decide
            raise
        notes = Counter(str(d["inputs"].get("diskFilling")) for d in log("none") if d["policyVersion"] == 1)
        print(f"\nfirst dry-run relocation {took:.1f} s after the policy; before it: {dict(notes)}")
        d = dry[0]
        assert d["dryRun"] and d["policyVersion"] == 1 and d["action"]["target"].split("/")[0] in ("filler", "idle")
        refs = [e["ref"] for e in d["evidence"] if e["source"] == "intelligence"]
        assert refs and refs[0].startswith("meter:node/full/disk-used/avg/10s@"), d["evidence"]
        assert "forecast at 95%" in d["reason"] and "full within the horizon" in d["inputs"]["diskFilling"], d
        assert not cordoned("full")
        assert get("filler")["node"] == "full" and get("idle")["node"] == "full"
        assert log("acted") == []

        # Enabled: cordon full and move one instance (two actions an hour), then the rate holds.
        ctl("apply", "-f", "-", env=env, stdin=policy(dry_run=False))
        held, took = eventually(lambda: [d for d in log("none") if d["policyVersion"] == 2 and d["heldBy"] == "rate"
                                         and d["action"]["type"] == "relocate"], 300, "a relocation held by the rate")
        print(f"rate held {took:.1f} s after enabling: {held[0]['reason']}")
        assert "rate: 2 actions in the last hour of 2 allowed" in held[0]["reason"], held[0]
        acted = log("acted")
        assert sorted(d["action"]["type"] for d in acted) == ["cordon", "relocate"], acted
        assert all(d["policyVersion"] == 2 and d["actor"] == "user:persys-automation" for d in acted)
        assert all(any(e["source"] == "intelligence" and e["ref"].startswith("meter:node/full/disk-used/")
                       for e in d["evidence"]) for d in acted), acted
        assert cordoned("full")
        moved = next(d for d in acted if d["action"]["type"] == "relocate")["action"]["target"].split("/")[0]
        stayed = "idle" if moved == "filler" else "filler"
        assert held[0]["action"]["target"].split("/")[0] == stayed
        eventually(lambda: get(moved)["node"] == "roomy" and get(moved)["phase"] == "Running", 120,
                   f"{moved} running on roomy")
        assert get(stayed)["node"] == "full"
        # More passes: still held, nothing more done.
        eventually(lambda: len([d for d in log("none") if d["policyVersion"] == 2 and d["heldBy"] == "rate"]) >= 3,
                   120, "more passes held by the rate")
        assert len(log("acted")) == 2 and get(stayed)["node"] == "full"
        assert (fill / "data").stat().st_size > 256 * MIB  # the disk did fill (bounded: FILL_LIMIT in all)
        audit = json.loads(ctl("audit", "--who", "persys-automation", "-o", "json", env=env).stdout)
        assert sorted(a["action"].rsplit("/", 1)[1] for a in audit) == ["CordonNode", "MoveInstance"], audit
        for n in ("filler", "idle"):
            ctl("delete", "workload", n, env=env, check=False)
    finally:
        dev.stop()
        for meta in data.glob("agents/*/runtimes/process/*/meta.json"):
            pid = json.loads(meta.read_text()).get("pid")
            if pid and pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
        shutil.rmtree(fill, ignore_errors=True)
