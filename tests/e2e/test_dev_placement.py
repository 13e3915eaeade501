"""`persysctl plan` and `explain` on a 3-node `persys dev` cluster: one roomy node, one tainted,
one too small."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.e2e.harness import REPO, ctl, eventually, start_dev

pytestmark = pytest.mark.e2e

HUGE = """
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: huge}
spec:
  type: process
  resources: {cpuMillicores: 200, memoryMb: 6000}
  process: {command: [sleep, "3600"]}
"""


def test_plan_and_explain(tmp_path: Path) -> None:
    dev, env = start_dev(tmp_path, "--nodes", str(REPO / "examples/dev-3-nodes.yaml"))
    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=120)
        # A dry run that fits on one node only; nothing is written.
        out = ctl("plan", "-f", str(REPO / "examples/placement-demo.yaml"), env=env).stdout
        assert "workload/placement-demo -> big" in out
        assert ("placed on big (1/3 nodes feasible)" in out and "rejected: 1 insufficient memory (needs 512 MiB, "
                "best node has 256 MiB free), 1 untolerated taint gpu=true:NoSchedule" in out), out
        assert json.loads(ctl("get", "workloads", "-o", "json", env=env).stdout) == []

        # One that fits nowhere: the aggregated reason, from plan, apply and explain alike.
        expected = ("0/3 nodes available: 2 insufficient memory (needs 6000 MiB, best node has 4096 MiB free), "
                    "1 untolerated taint gpu=true:NoSchedule")
        assert expected in ctl("plan", "-f", "-", env=env, stdin=HUGE).stdout
        ctl("apply", "-f", "-", env=env, stdin=HUGE)
        view, _ = eventually(lambda: (lambda w: w if w["reason"] == "Unschedulable" else None)(
            json.loads(ctl("get", "workloads", "huge", "-o", "json", env=env).stdout)), 10, "huge Pending")
        # The aggregated line, then every failing filter of each node with its figures.
        assert view["phase"] == "Pending" and view["message"].startswith(expected + ". Per node: ")
        every = ("gpu: untolerated taint gpu=true:NoSchedule", "tiny: insufficient memory (needs 6000 MiB, node has "
                 "256 MiB free, short by 5744 MiB)", "big: insufficient memory (needs 6000 MiB, node has 4096 MiB "
                 "free, short by 1904 MiB)")
        assert all(text in view["message"] for text in every), view["message"]
        described = ctl("describe", "workload", "huge", env=env).stdout
        assert expected in described and all(text in described for text in every), described
        explained = ctl("explain", "huge", "--node", "gpu", env=env).stdout
        assert expected in explained
        assert "FAIL taint_toleration  untolerated taint gpu=true:NoSchedule" in explained
        tiny = ctl("explain", "huge", "--node", "tiny", "-o", "json", env=env).stdout
        verdicts = {f["filter"]: f for f in json.loads(tiny)["node"]["filters"]}
        assert not verdicts["memory_fit"]["passed"] and verdicts["memory_fit"]["needed"] == 6000

        # A placed workload explains where it went and the runners-up.
        ctl("apply", "-f", str(REPO / "examples/placement-demo.yaml"), env=env)
        eventually(lambda: json.loads(ctl("get", "workloads", "placement-demo", "-o", "json", env=env).stdout)
                   ["ready"] == "2/2", 15, "placement-demo 2/2 ready")
        out = ctl("explain", "placement-demo", env=env).stdout
        assert "workload/placement-demo: Running on big" in out and "top candidates" in out
        ctl("delete", "workload", "placement-demo", env=env)
        ctl("delete", "workload", "huge", env=env)

        # Several documents go in one bulk request; applying them again changes nothing.
        many = "---".join(HUGE.replace("name: huge", f"name: bulk-{i}").replace("6000", "16") for i in range(3))
        assert ctl("apply", "-f", "-", env=env, stdin=many).stdout.split("\n")[:3] == [
            f"workload/bulk-{i} created" for i in range(3)]
        assert ctl("apply", "-f", "-", env=env, stdin=many).stdout.count("unchanged") == 3
        eventually(lambda: sum(w["phase"] == "Running" for w in json.loads(
            ctl("get", "workloads", "-o", "json", env=env).stdout) if w["name"].startswith("bulk-")) == 3, 15,
            "bulk Running")
        for i in range(3):  # persys dev leaves running workloads alone when it stops: remove ours
            ctl("delete", "workload", f"bulk-{i}", env=env)
    finally:
        dev.stop(signal.SIGINT)


KVM_VM = """
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: needs-kvm}
spec:
  type: vm
  requiredFeatures: ["vm:accel:kvm"]
  vm: {image: debian-base}
"""


def test_vm_is_tcg_here_and_kvm_cannot_be_required(tmp_path: Path) -> None:
    dev, env = start_dev(tmp_path)
    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=120)
        node = json.loads(ctl("get", "nodes", "-o", "json", env=env).stdout)[0]
        runtimes = node["capabilities"]["runtimes"]
        if "vm" not in runtimes:
            pytest.skip("libvirt is not running here: no vm runtime to check")
        assert "accel:tcg" in runtimes["vm"]["features"] and "accel:kvm" not in runtimes["vm"]["features"]
        ctl("apply", "-f", "-", env=env, stdin=KVM_VM)
        view, _ = eventually(lambda: (lambda w: w if w["reason"] == "Unschedulable" else None)(
            json.loads(ctl("get", "workloads", "needs-kvm", "-o", "json", env=env).stdout)), 10, "Pending")
        assert view["message"] == ("0/1 nodes available: 1 missing runtime feature vm:accel:kvm. "
                                   f"Per node: {node['id']}: missing runtime feature vm:accel:kvm")
        ctl("delete", "workload", "needs-kvm", env=env)
    finally:
        dev.stop(signal.SIGINT)
