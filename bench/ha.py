"""Failover and node-loss timings with default settings, on real processes.

    .venv/bin/python bench/ha.py [--repeat 3]

failover   kill -9 the active scheduler replica (two replicas on a real etcd): seconds until the
           standby is elected, and until a workload applied right after the kill is placed by it.
node loss  freeze an agent (SIGSTOP: it stops heartbeating, its workloads keep running) with the
           default node grace period (10 s): seconds until its workload is Running elsewhere.
Baseline, same run: etcd's own leader re-election is not involved (one etcd member); the grace
period is the floor of node-loss detection, shown next to the measured time.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.harness import Components, active_replica, eventually, process_manifest  # noqa: E402
from tests.fixtures_infra import start_etcd  # noqa: E402

GRACE_DEFAULT = 10.0


def failover_once(tmp: Path) -> tuple[float, float]:
    etcd = start_etcd(tmp / "etcd")
    c = Components(tmp, etcd.url, replicas=2, nodes=("n1",))
    try:
        leader, _ = eventually(lambda: active_replica(c), 15, "an active replica")
        victim = c.schedulers[int(str(leader["replicaId"])[1:])]
        victim.stop(signal.SIGKILL)
        killed = time.time()
        c.ctl("apply", "-f", "-", stdin=process_manifest("probe"))
        new, _ = eventually(lambda: (lambda h: h if h and h["replicaId"] != leader["replicaId"] else None)(
            active_replica(c)), 30, "standby elected")
        eventually(lambda: c.workload("probe")["phase"] in ("Scheduled", "Running"), 30, "probe placed")
        placed = time.time()
        return float(new["electedAt"]) - killed, placed - killed
    finally:
        c.stop()
        etcd.stop()


def node_loss_once(tmp: Path) -> float:
    etcd = start_etcd(tmp / "etcd")
    c = Components(tmp, etcd.url, nodes=("a", "b"), agent_args=("--cpu-millicores", "8000"))
    try:
        c.ctl("apply", "-f", "-", stdin=process_manifest("moving"))
        w, _ = eventually(lambda: (lambda v: v if v["phase"] == "Running" else None)(c.workload("moving")), 20,
                          "Running")
        lost = c.agents[w["node"]]
        assert lost.proc is not None
        lost.proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        eventually(lambda: (lambda v: v if v["phase"] == "Running" and v["node"] != w["node"] else None)(
            c.workload("moving")), 60, "Running elsewhere")
        took = time.monotonic() - t0
        lost.proc.send_signal(signal.SIGCONT)
        c.ctl("delete", "workload", "moving")
        return took
    finally:
        c.stop()
        etcd.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    elect, place, loss = [], [], []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory() as d:
            e, p = failover_once(Path(d))
            elect.append(e)
            place.append(p)
            print(f"failover {i + 1}: elected {e:.2f}s, probe placed {p:.2f}s after kill -9", flush=True)
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory() as d:
            t = node_loss_once(Path(d))
            loss.append(t)
            print(f"node loss {i + 1}: Running elsewhere {t:.2f}s after the agent froze", flush=True)
    summary = {
        "failover_elected_s": statistics.median(elect),
        "failover_reconciling_s": statistics.median(place),
        "node_loss_to_running_s": statistics.median(loss),
        "node_grace_s": GRACE_DEFAULT,
        "repeat": args.repeat,
    }
    print(f"failover: new replica elected {summary['failover_elected_s']:.2f}s, reconciling (probe placed) "
          f"{summary['failover_reconciling_s']:.2f}s after kill -9 (target < 3 s)")
    print(f"node loss: Running elsewhere {summary['node_loss_to_running_s']:.2f}s after the node froze "
          f"(grace {GRACE_DEFAULT:.0f}s, ratio {summary['node_loss_to_running_s'] / GRACE_DEFAULT:.2f}x; "
          "target < 15 s)")
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    path = out / f"ha-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(summary, indent=1))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
