"""Chaos around node liveness: agents killed, the scheduler restarted, most nodes lost at once,
nodes deleted. Real etcd, scheduler, agents (one OS process each) and gateway; persysctl."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness import Components, Proc, epoch, eventually, persys, pid_alive, process_manifest
from tests.fixtures_infra import start_etcd

pytestmark = pytest.mark.e2e
# Seconds; the default is 10, shortened to keep the test quick (not to 3, the heartbeat interval:
# seven agents on a busy machine would then flap).
GRACE = 5
# The guard's longest suspension: three grace periods (the default is six; shortened to keep
# the test quick, the rule is the same).
SUSPENSION = 3 * GRACE
NODES = tuple(f"n{i}" for i in range(7))  # the guard is set to apply from 5 nodes on (default 10)
ALIVE = ("n0", "n1")
FIRST_DEAD = ("n6",)  # a minority: marked NotReady
MASS_DEAD = tuple(f"n{i}" for i in range(2, 6))  # then 4 of 7: more than half


class Cluster(Components):
    """The harness's components, started in an order that holds up on a loaded machine: the
    scheduler and gateway first, then the agents, each given a minute to start."""

    def __init__(self, tmp: Path, store_url: str, nodes: tuple[str, ...], scheduler_args: tuple[str, ...]) -> None:
        self.tmp, self.pki = tmp, tmp / "pki"
        subprocess.run(persys("certs", "init", "--dir", str(self.pki), *[a for n in nodes for a in ("--node", n)]),
                       check=True, capture_output=True, timeout=120)
        self.agents: dict[str, Proc] = {}
        self.gateway: Proc | None = None
        # Port 0 everywhere; a restarted scheduler takes the port it bound first (agents list it).
        self.scheduler = Proc("scheduler-0", persys(
            "scheduler", "--listen", "127.0.0.1:0", "--store", store_url, "--replica-id", "r0", "--tls-dir",
            str(self.pki), "--data-dir", str(tmp / "scheduler-0"), *scheduler_args), tmp)
        self.schedulers = [self.scheduler]
        try:
            self.scheduler.wait_for("scheduler ready", 60)
            port = re.search(r"scheduler ready on port (\d+)", self.scheduler.text())[1]  # type: ignore[index]
            self.target = f"127.0.0.1:{port}"
            self.replica_targets = [self.target]
            self.scheduler.argv[self.scheduler.argv.index("127.0.0.1:0")] = self.target
            self.gateway = Proc("gateway", persys("gateway", "--scheduler", self.target, "--listen", "127.0.0.1:0",
                                                  "--tls-dir", str(self.pki)), tmp)
            self.gateway.wait_for("gateway ready", 60)
            self.gw_port = int(re.search(r"gateway ready on https://[^:]+:(\d+)",  # type: ignore[index]
                                         self.gateway.text())[1])
            for n in nodes:
                self.agents[n] = Proc(f"agent-{n}", persys("agent", "--scheduler", self.target, "--node-id", n,
                                                           "--tls-dir", str(self.pki), "--state-dir",
                                                           str(tmp / f"agent-{n}")), tmp)
            for n, a in self.agents.items():
                a.wait_for(f"agent {n} started", 60)
        except BaseException:
            self.stop()  # whatever did start
            raise
        cfg = tmp / "persysctl.yaml"
        cfg.write_text(yaml.safe_dump({"server": f"https://127.0.0.1:{self.gw_port}", "ca": str(self.pki / "ca.crt"),
                                       "cert": str(self.pki / "admin.crt"), "key": str(self.pki / "admin.key")}))
        self.env = {"PERSYS_CONFIG": str(cfg)}

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for a in self.agents.values():
            a.stop()
        self.scheduler.stop()


@contextlib.contextmanager
def cluster_of(tmp: Path, nodes: tuple[str, ...], *scheduler_args: str) -> Iterator[Cluster]:
    etcd = start_etcd(tmp / "etcd")
    c: Cluster | None = None
    try:
        # The restart grace (six node graces by default) as short as it goes, one grace: these
        # tests are about what happens once nodes unheard after a restart are judged.
        c = Cluster(tmp, etcd.url, nodes, ("--node-grace", str(GRACE), "--restart-grace", str(GRACE),
                                           *scheduler_args))
        yield c
    finally:
        if c is not None:
            c.stop()
        etcd.stop()
        _kill_workloads(tmp)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_of(tmp_path, NODES, "--liveness-guard-min-nodes", "5", "--liveness-suspension",
                    str(SUSPENSION)) as c:
        yield c


def _kill_workloads(tmp: Path) -> None:
    """Process workloads outlive their agent (on purpose): end the ones this test started."""
    for meta in tmp.glob("agent-*/runtimes/process/*/meta.json"):
        pid = json.loads(meta.read_text()).get("pid")
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def statuses(c: Cluster) -> dict[str, str]:
    return {n["id"]: n["status"] for n in json.loads(c.ctl("get", "nodes", "-o", "json").stdout)}


def events(c: Cluster) -> list[dict]:  # type: ignore[type-arg]
    return json.loads(c.ctl("events", "--limit", "2000", "-o", "json").stdout)  # type: ignore[no-any-return]


def restart_scheduler(c: Cluster) -> float:
    c.scheduler.stop()
    c.scheduler.start()
    c.scheduler.wait_for("scheduler ready", 30)
    return time.time()


def watch_stay_not_ready(c: Cluster, dead: tuple[str, ...], seconds: float) -> None:
    """Through a restart's grace period and beyond, dead nodes never show Ready."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            now = statuses(c)
        except AssertionError:
            time.sleep(0.2)  # the gateway reconnects to the restarted scheduler
            continue
        revived = [n for n in dead if now.get(n) == "Ready"]
        assert not revived, f"dead nodes shown Ready after the scheduler restarted: {revived}"
        time.sleep(0.2)


def test_dead_nodes_stay_dead_across_restarts_and_mass_loss_is_not_hidden_for_ever(cluster: Cluster) -> None:
    c = cluster
    eventually(lambda: set(statuses(c).values()) == {"Ready"} and len(statuses(c)) == len(NODES), 60,
               "every node Ready")

    # 1. A minority dies: marked NotReady. A restarted scheduler must not revive them.
    for n in FIRST_DEAD:
        c.agents[n].stop(signal.SIGKILL)
    eventually(lambda: all(statuses(c)[n] == "NotReady" for n in FIRST_DEAD), 30, "the dead minority NotReady")
    restarted = restart_scheduler(c)
    watch_stay_not_ready(c, FIRST_DEAD, 2 * GRACE)
    revived = [e for e in events(c) if e["kind"] == "NodeReady" and epoch(e["ts"]) >= restarted
               and e["subject"].removeprefix("node/") in FIRST_DEAD]
    assert not revived, f"NodeReady published after the restart: {revived}"

    # 2. Most nodes die while the scheduler is down: when it is back, they all fall silent past
    #    its grace period at once, which trips the mass-loss guard; but it ends by itself after
    #    SUSPENSION and they are marked NotReady (once it suspended liveness for ever).
    c.scheduler.stop()
    for n in MASS_DEAD:
        c.agents[n].stop(signal.SIGKILL)
    c.scheduler.start()
    c.scheduler.wait_for("scheduler ready", 30)
    back, back_wall = time.monotonic(), time.time()
    watch_stay_not_ready(c, FIRST_DEAD, GRACE + 1)
    eventually(lambda: all(statuses(c)[n] == "NotReady" for n in MASS_DEAD), GRACE + SUSPENSION + 20,
               "the mass of dead nodes NotReady once the guard's time is up")
    took = time.monotonic() - back
    seen = {(e["kind"], e["reason"]): epoch(e["ts"]) - back_wall for e in events(c)}
    assert ("LivenessSuspended", "TooManyLost") in seen, seen
    assert ("LivenessResumed", "Expired") in seen, seen
    assert took >= SUSPENSION, f"marked NotReady {took:.1f}s after the restart: the guard did not hold"
    print(f"after the restart (grace {GRACE}s, guard at most {SUSPENSION}s): guard tripped at "
          f"{seen['LivenessSuspended', 'TooManyLost']:.1f}s, expired at {seen['LivenessResumed', 'Expired']:.1f}s, "
          f"dead nodes seen NotReady at {took:.1f}s")

    # 3. Restart with 5 of 7 dead: they stay NotReady, the guard stays off, and new work
    #    lands on the two live nodes only.
    dead = FIRST_DEAD + MASS_DEAD
    restarted = restart_scheduler(c)
    watch_stay_not_ready(c, dead, 2 * GRACE)
    assert not [e for e in events(c) if epoch(e["ts"]) >= restarted and (e["kind"] == "LivenessSuspended" or (
        e["kind"] == "NodeReady" and e["subject"].removeprefix("node/") in dead))]
    assert c.health()["liveness"]["suspended"] is False
    c.ctl("apply", "-f", "-", stdin=process_manifest("spread", replicas=4))
    view, _ = eventually(lambda: (lambda w: w if w["ready"] == "4/4" else None)(c.workload("spread")), 30,
                         "4 replicas Running")
    assert set(view["nodes"]) <= set(ALIVE), view["nodes"]

    # 4. Node deletion: a dead node without work goes; again is not an error; a node with work
    #    is refused unless forced; forced, its work moves; its agent comes back as a new node.
    out = c.ctl("delete", "node", "n6").stdout
    assert "node/n6 deleted" in out
    assert "n6" not in statuses(c)
    assert "already gone" in c.ctl("delete", "node", "n6").stdout
    on_n0 = [i for i in view["instances"] if i["node"] == "n0"]
    assert on_n0, "the test needs work on n0"
    c.ctl("label", "node", "n0", "keep=me")
    refused = c.ctl("delete", "node", "n0", check=False)
    assert refused.returncode == 1 and "drain" in refused.stderr and "--force" in refused.stderr, refused
    assert statuses(c)["n0"] == "Ready" and c.workload("spread")["ready"] == "4/4", "a refusal changes nothing"
    os.kill(c.agents["n0"].pid, signal.SIGSTOP)  # frozen: it cannot register again before its work moved
    try:
        assert "node/n0 deleted" in c.ctl("delete", "node", "n0", "--force").stdout
        eventually(lambda: (lambda w: w["ready"] == "4/4" and set(w["nodes"]) == {"n1"})(c.workload("spread")), 30,
                   "the deleted node's work Running on n1")
        assert "n0" not in statuses(c)
    finally:
        os.kill(c.agents["n0"].pid, signal.SIGCONT)
    deleted = [e["subject"] for e in events(c) if e["kind"] == "NodeDeleted"]
    assert deleted == ["node/n6", "node/n0"], deleted
    stale = [int(i["runtimeId"]) for i in on_n0]
    # The agent wakes up: it registers again as a new node, and stops its stale copies.
    eventually(lambda: statuses(c).get("n0") == "Ready", 30, "n0 registered again")
    node = json.loads(c.ctl("get", "nodes", "n0", "-o", "json").stdout)
    assert "keep" not in node["labels"], "a deleted node comes back as new, without its old operator labels"
    assert [e for e in events(c) if e["kind"] == "NodeJoined" and e["subject"] == "node/n0"]
    eventually(lambda: not any(pid_alive(p) for p in stale), 30, "stale copies on n0 stopped")
    assert set(c.workload("spread")["nodes"]) == {"n1"}


@pytest.fixture
def small_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_of(tmp_path, ("a", "b", "c", "d"), "--liveness-guard-min-nodes", "3",
                    "--liveness-suspension", "600") as c:
        yield c


def test_health_shows_the_guard_and_an_operator_ends_it(small_cluster: Cluster) -> None:
    c = small_cluster
    eventually(lambda: statuses(c) == dict.fromkeys("abcd", "Ready"), 60, "every node Ready")
    # Killed while the scheduler is down, they fall silent past its grace period in the same
    # check when it is back (the guard counts the nodes lost in one check).
    c.scheduler.stop()
    for n in "bcd":
        c.agents[n].stop(signal.SIGKILL)
    c.scheduler.start()
    c.scheduler.wait_for("scheduler ready", 30)
    h, _ = eventually(lambda: (lambda h: h if h["liveness"]["suspended"] else None)(c.health()), 30,
                      "the guard's suspension in health")
    g = h["liveness"]
    assert (g["reason"], g["silentNodes"], g["judgedNodes"]) == ("TooManyLost", 3, 4), g
    assert 590 <= epoch(g["endsAt"]) - epoch(g["since"]) <= 610 and abs(epoch(g["since"]) - time.time()) < 30, g
    assert "liveness suspended: 3 of 4 nodes silent" in h["detail"]
    table = c.ctl("health").stdout
    assert "SUSPENDED" in table and "persysctl admin liveness resume" in table, table
    assert statuses(c) == dict.fromkeys("abcd", "Ready"), "suspended: nobody is marked NotReady"

    out = c.ctl("admin", "liveness", "resume").stdout
    assert "liveness resumed; 3 of 4 nodes were silent" in out, out
    eventually(lambda: statuses(c) == {"a": "Ready", "b": "NotReady", "c": "NotReady", "d": "NotReady"}, 15,
               "silent nodes NotReady after the operator's resume")
    assert c.health()["liveness"]["suspended"] is False
    assert "was not suspended" in c.ctl("admin", "liveness", "resume").stdout  # idempotent
    resumed = [e for e in events(c) if e["kind"] == "LivenessResumed"]
    assert [e["reason"] for e in resumed] == ["Operator"] and "ended by an operator" in resumed[0]["message"], resumed
