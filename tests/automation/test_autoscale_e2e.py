"""Automation end to end on real processes: a scheduler (SQLite store, Persys Meter on DuckDB), an
agent running Docker containers, the gateway, and `persys automation` as its own process with its
own operator certificate.

A busybox container burning CPU scales out under the load (its policy: 3 % of a core per replica,
at most 2 replicas: a burner on 2 cores at load 37 still gets ~5 %); once both replicas run, the
test ends the load (a file the burners look for) and the workload scales back in, no sooner than
the scale-down window allows; every evaluation is in the decision log with its inputs and evidence;
the scale was done (and audited) as the automation's identity. A paused policy does nothing but
record that it was paused; a dry-run policy decides the same action every time (no cooldown
consumed) and changes nothing."""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.docker_fixtures import DockerEngine
from tests.e2e.harness import Components, Proc, epoch, eventually, persys
from tests.security.role_certs import issue_user

pytestmark = pytest.mark.e2e
DOWN_WINDOW = 30  # the burner policy's scale-down stabilisation window
INTERVAL = 5
STOP_FILE = "/tmp/stop-burning"  # inside the burner's containers (busybox: /tmp exists)


def burner(name: str) -> str:
    # An arithmetic loop (no fork per turn) that looks for the stop file every few thousand turns.
    # The load ends when the test has seen the scale-out, not at a fixed time (a 50 s load from
    # the apply, until 2026-12-06: the scale-in waited for it even when the scale-out came early).
    loop = f"while [ ! -e {STOP_FILE} ]; do i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; done; sleep 3600"
    return yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                           "spec": {"type": "container", "resources": {"cpuMillicores": 300, "memoryMb": 32},
                                    "container": {"image": "persys/busybox:latest",
                                                  "command": ["sh", "-c", loop]}}})


def idle(name: str) -> str:
    return yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                           "spec": {"type": "container", "resources": {"cpuMillicores": 50, "memoryMb": 16},
                                    "container": {"image": "persys/busybox:latest", "command": ["sleep", "3600"]}}})


def policy(name: str, workload: str, **spec: Any) -> dict[str, Any]:
    body = {"workload": workload, "intervalSeconds": INTERVAL, **spec.pop("autoscale")}
    return {"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": name},
            "spec": {**spec, "autoscale": body}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, docker_engine: DockerEngine) -> Iterator[Components]:
    tmp = tmp_path_factory.mktemp("autoscale")
    c = Components(tmp, f"sqlite:///{tmp / 'state.db'}", nodes=("auto-n1",),
                   scheduler_args=("--meter", f"duckdb:{tmp / 'meter.duckdb'}"))
    names = [docker_engine.workload_id(n) for n in ("burn", "idle")]
    try:
        yield c
    finally:
        for n in names:
            c.ctl("delete", "workload", n, check=False)
        c.stop()
        for n in names:
            for inst in (n, f"{n}.1", f"{n}.2"):
                subprocess.run(["docker", "rm", "-f", f"persys-auto-n1-{inst}"], capture_output=True, timeout=60)


def log(c: Components, policy_name: str) -> list[dict[str, Any]]:
    items = json.loads(c.ctl("automation", "log", policy_name, "--limit", "5000", "-o", "json").stdout)
    return [{**d, "ts": epoch(d["ts"])} for d in items]  # persysctl prints RFC 3339 times


def test_scale_out_under_load_and_back_in(cluster: Components, docker_engine: DockerEngine) -> None:
    c = cluster
    burn, quiet = docker_engine.workload_id("burn"), docker_engine.workload_id("idle")
    tls = issue_user(c.pki, "persys-automation", ("persys:operators",))
    auto = Proc("automation", persys("automation", "--scheduler", c.target, "--tls-dir", str(c.pki), "--name",
                                     tls.cert.stem, "--tick", "0.5"), c.tmp)
    try:
        auto.wait_for("automation ready", timeout=60)
        c.ctl("apply", "-f", "-", stdin=idle(quiet))
        eventually(lambda: c.workload(quiet)["phase"] == "Running", 60, "idle Running")
        policies = [
            policy("burn-cpu", burn, autoscale={
                "metric": "cpu", "target": 3, "maxReplicas": 2, "metricWindowSeconds": 20, "staleAfterSeconds": 45,
                "stabilization": {"upSeconds": 0, "downSeconds": DOWN_WINDOW}}),
            # Would scale the idle workload to 3 at once (any memory is far over 0.01 MiB a replica).
            policy("idle-paused", quiet, paused=True, autoscale={"metric": "memory", "target": 0.01,
                                                                 "maxReplicas": 3}),
            policy("idle-dry", quiet, dryRun=True, autoscale={"metric": "memory", "target": 0.01, "maxReplicas": 3,
                                                              "cooldown": {"upSeconds": 600}}),
        ]
        c.ctl("apply", "-f", "-", stdin=yaml.safe_dump_all(policies))
        c.ctl("apply", "-f", "-", stdin=burner(burn))
        first, _ = eventually(lambda: (w := c.workload(burn))["phase"] == "Running" and w["instances"][0]["runtimeId"],
                              60, "the burner Running")
        (_, out_after) = eventually(lambda: c.workload(burn)["replicas"] == 2, 120, "the scale-out")
        # Both replicas burn until told: the second one's container must exist to be told.
        (both, _) = eventually(lambda: (w := c.workload(burn))["ready"] == "2/2"
                               and all(i["runtimeId"] for i in w["instances"]) and w["instances"], 120,
                               "both burners Running")
        for inst in both:
            subprocess.run(["docker", "exec", inst["runtimeId"], "touch", STOP_FILE], check=True,
                           capture_output=True, timeout=60)
        stopped = time.time()
        (_, in_after) = eventually(lambda: c.workload(burn)["replicas"] == 1, 200, "the scale-in")
        print(f"automation e2e: scale-out {out_after:.0f}s after the apply, scale-in {in_after:.0f}s after "
              "the load stopped")
        # A scale is not a new revision: the first replica ran on, never restarted.
        after = c.workload(burn)["instances"][0]
        assert (after["runtimeId"], after["restarts"]) == (first, 0), after

        decisions = log(c, "burn-cpu")
        acted = [d for d in decisions if d["outcome"] == "acted"]
        assert [(d["action"]["from"], d["action"]["to"]) for d in acted] == [(1, 2), (2, 1)], acted
        up, down = acted
        assert down["ts"] > stopped  # not before the load stopped
        assert up["inputs"]["perReplica"] > 3 and up["rawDesired"] >= 2 and up["actor"] == "user:persys-automation"
        ev = up["evidence"][0]
        assert ev["source"] == "meter" and ev["query"]["value"] == burn and ev["end"] - ev["start"] >= 20
        assert up["evidence"][1]["ref"].startswith(f"workload/{burn}@")
        # The scale-in waited for its window: no recommendation above 1 in the 30 s before it.
        t_down = down["ts"]
        window = [d for d in decisions if t_down - DOWN_WINDOW < d["ts"] <= t_down]
        # (a pass while the second replica's first samples were still on their way has no
        # recommendation at all: held as stale, which is never a scale-in)
        assert window and all(d["inputs"]["recommendation"] <= 1 if d["inputs"]["recommendation"] is not None
                              else (d["outcome"], d["heldBy"]) == ("none", "stale") for d in window), window
        held = [d for d in decisions if up["ts"] < d["ts"] < t_down and d["heldBy"] == "stabilization"]
        assert held, "the window held the scale-in at least once"
        # Every evaluation was recorded, "do nothing" too: one per interval, none skipped.
        ts = [d["ts"] for d in decisions]
        assert len(ts) >= (t_down - ts[0]) / INTERVAL - 1
        assert max(b - a for a, b in itertools.pairwise(ts)) < 3 * INTERVAL
        assert {d["outcome"] for d in decisions} <= {"acted", "none"}
        assert all(d["policyVersion"] == 1 and d["reason"] for d in decisions)

        # The paused policy decided nothing; the dry run decided each time and did nothing.
        paused = log(c, "idle-paused")
        assert paused and {(d["outcome"], d["heldBy"]) for d in paused} == {("paused", "paused")}
        dry = log(c, "idle-dry")
        # (before the idle workload's first samples reach the meter: nothing to go by, held as stale)
        first = next(i for i, d in enumerate(dry) if d["outcome"] == "dry-run")
        assert {(d["outcome"], d["heldBy"]) for d in dry[:first]} <= {("none", "stale")}, dry
        after = dry[first:]
        assert len(after) >= 3 and all(d["outcome"] == "dry-run" and d["action"]["to"] == 3 for d in after), after
        assert all(d["heldBy"] != "cooldown" for d in after)  # a dry run consumes no cooldown
        assert c.workload(quiet)["replicas"] == 1

        # Audited as the automation's identity; the events name the policy.
        audit = json.loads(c.ctl("audit", "--who", "persys-automation", "-o", "json").stdout)
        applies = [a for a in audit if a["action"].endswith("ApplyWorkload")]
        assert len(applies) == 2 and all(a["result"] == "OK" for a in applies), audit
        events = json.loads(c.ctl("events", "--for", "policy/burn-cpu", "-o", "json").stdout)
        assert [e["kind"] for e in events].count("AutomationActed") == 2
        # Replay over the same history runs the same decision (it is compared exactly in
        # test_replay_agreement; here: it reads this meter and sees the load).
        rep = json.loads(c.ctl("policy", "replay", "burn-cpu", "--since", "10m", "--start-replicas", "1",
                               "-o", "json").stdout)
        # (a reversal within a minute is a flap: on a loaded machine the samples come late and the
        # load's scale-out and scale-in may fall within one)
        assert rep["actions"] >= 2 and rep["replicas"]["max"] == 2 and rep["flaps"] <= 1, rep
    finally:
        auto.stop()
