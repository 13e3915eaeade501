"""What-if through persysctl on a 3-node `persys dev` cluster (examples/dev-3-nodes.yaml: `big`,
`gpu` tainted gpu=true:NoSchedule, `tiny`): `plan --drain` says what the real drain then does
(one instance moves, one has nowhere to go; the drain says so and fails at its deadline naming
it), and the top counterfactual of the Pending one, once applied, places it where it said."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.e2e.harness import REPO, ctl, eventually, process_manifest, start_dev

pytestmark = pytest.mark.e2e


def manifest(name: str, memory: int, extra: str = "") -> str:
    return process_manifest(name, memory=memory, extra=extra)


# Tolerates gpu's taint, too big for tiny: after big is drained, only gpu takes it.
MOVER = manifest("mover", 1000, "  tolerations: [{key: gpu, operator: Equal, value: 'true', effect: NoSchedule}]\n")
STUCK = manifest("stuck", 3000)  # big only (gpu's taint, tiny's 256 MiB): nowhere once big is drained


def test_plan_drain_matches_the_drain_and_a_counterfactual_places_it(tmp_path: Path) -> None:
    dev, env = start_dev(tmp_path, "--nodes", str(REPO / "examples/dev-3-nodes.yaml"))
    applied: list[str] = []

    def where(name: str) -> str:
        return str(json.loads(ctl("get", "workloads", name, "-o", "json", env=env).stdout)["node"] or "")

    def running_on(name: str, node: str) -> bool:
        w = json.loads(ctl("get", "workloads", name, "-o", "json", env=env).stdout)
        return bool(w["phase"] == "Running" and w["node"] == node)

    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=120)
        ctl("cordon", "gpu", env=env)  # both start on big
        for doc in (MOVER, STUCK):
            ctl("apply", "-f", "-", env=env, stdin=doc)
        applied += ["mover", "stuck"]
        eventually(lambda: running_on("mover", "big") and running_on("stuck", "big"), 20, "both Running on big")
        ctl("uncordon", "gpu", env=env)

        plan = json.loads(ctl("plan", "--drain", "big", "-o", "json", env=env).stdout)
        assert plan["affectedNodes"] == ["big"]
        assert [(m["instance"], m["from"], m["to"]) for m in plan["moves"]] == [("mover", "big", "gpu")], plan
        assert [p["instance"] for p in plan["pending"]] == ["stuck"], plan
        assert "1 untolerated taint gpu=true:NoSchedule" in plan["pending"][0]["explanation"]
        text = ctl("plan", "--drain", "big", env=env).stdout
        assert "1 would move, 1 would stay Pending" in text and "workload/mover (from big) -> gpu" in text, text
        assert "big" in where("mover") and "big" in where("stuck"), "a plan changes nothing"

        # The drain does what the plan said, and says it is not done because of stuck.
        drained = ctl("drain", "big", "--deadline", "12", env=env, check=False)
        assert drained.returncode != 0, drained.stdout
        assert "stuck" in drained.stderr and "waiting for room" in drained.stderr, drained.stderr
        assert "insufficient memory" in drained.stderr, drained.stderr
        eventually(lambda: running_on("mover", "gpu"), 20, "mover Running on gpu, as planned")
        assert where("stuck") == ""

        # The smallest change that would place stuck, checked by the engine; applied, it holds.
        what = json.loads(ctl("explain", "stuck", "--what-if", "-o", "json", env=env).stdout)
        changes = what["replicas"][0]["changes"]
        kinds = [c["kind"] for c in changes]
        assert {"resources", "tolerate", "uncordon"} <= set(kinds), changes
        top = changes[0]
        assert top["kind"] == "resources" and top["resources"] == {"memoryMb": 256} and top["landsOn"] == "tiny"
        assert "1. fits 1 node(s) with memory <= 256 MiB" in ctl("explain", "stuck", "--what-if", env=env).stdout
        ctl("apply", "-f", "-", env=env, stdin=manifest("stuck", 256))
        eventually(lambda: running_on("stuck", top["landsOn"]), 20, "stuck placed where the counterfactual said")
    finally:
        for name in applied:  # persys dev leaves running workloads alone when it stops: remove ours
            ctl("delete", "workload", name, env=env, check=False)
        dev.stop(signal.SIGINT)


NODES = """
nodes:
  - {name: small-disk, runtimes: [process], diskMb: 1000, cpuMillicores: 2000, memoryMb: 2048}
  - {name: roomy, runtimes: [process], diskMb: 50000, cpuMillicores: 2000, memoryMb: 2048}
"""


def test_dev_nodes_describe_runtimes_and_disk(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text(NODES)
    dev, env = start_dev(tmp_path, "--nodes", str(tmp_path / "nodes.yaml"))
    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=120)
        nodes = {n["id"]: n for n in json.loads(ctl("get", "nodes", "-o", "json", env=env).stdout)}
        assert set(nodes["small-disk"]["capabilities"]["runtimes"]) == {"process"}
        assert nodes["small-disk"]["capabilities"]["diskMb"] == 1000
        disk = manifest("disky", 64).replace("memoryMb: 64}", "memoryMb: 64, diskMb: 1500}")
        plan = json.loads(ctl("plan", "-f", "-", "-o", "json", env=env, stdin=disk).stdout)[0]["replicas"][0]
        assert plan["node"] == "roomy"
        assert plan["decision"]["rejections"]["small-disk"]["code"] == "insufficient_disk"
        # What if a node like roomy but tainted joined: nothing Pending, nothing moves.
        (tmp_path / "add.yaml").write_text("- {name: extra, cpuMillicores: 1000, taints: ['t=1:NoSchedule']}\n")
        added = json.loads(ctl("plan", "--add-node", str(tmp_path / "add.yaml"), "-o", "json", env=env).stdout)
        assert added["affectedNodes"] == ["extra"] and added["moves"] == [] and added["placed"] == []
        bad = ctl("plan", "--drain", "nope", env=env, check=False)  # a 400 naming the field, nothing written
        assert bad.returncode != 0 and "nodes: no node 'nope'" in bad.stderr, bad.stderr
        placed = ctl("explain", "disky", "--what-if", env=env, check=False)
        assert placed.returncode != 0 and "disky" in placed.stderr  # never applied: not found
    finally:
        dev.stop(signal.SIGINT)
