"""The dashboard's server time against a real control plane at scale: a scheduler process (SQLite
store), hollow agents (bench/scale/hollow.py: N simulated nodes on the real agent link, every
workload reported Running), a gateway process, M workloads applied through the REST API. Then
a signed-in session (an admin API token) asks for the overview and the other pages that walk
every object, --runs times each, and the wall time of each answer on loopback is printed
(median and max, ms). Target (issue 35): the overview under 300 ms at 5,000 nodes / 50,000
workloads.

    .venv/bin/python bench/dashboard_scale.py [--nodes 5000] [--workloads 50000] [--runs 15]

Every process started here is stopped on exit, and its files removed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.e2e.harness import Proc, eventually, persys  # noqa: E402


def manifest(i: int) -> dict[str, object]:
    return {"apiVersion": "persys.dev/v1", "kind": "Workload",
            "metadata": {"name": f"w{i:05d}", "labels": {"app": f"a{i % 50}", "tier": "web"}},
            "spec": {"type": "process", "resources": {"cpuMillicores": 10, "memoryMb": 16},
                     "process": {"command": ["sleep", "3600"]}}}


def timed(client: httpx.Client, path: str, runs: int) -> tuple[float, float, int]:
    took = []
    size = 0
    client.get(path)  # once unmeasured: what only the first answer pays (a cold cache) is not a page's time
    for _ in range(runs):
        t0 = time.perf_counter()
        r = client.get(path)
        took.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        size = len(r.content)
    return statistics.median(took), max(took), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--workloads", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--batch", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dash-scale-"))
    pki = tmp / "pki"
    subprocess.run(persys("certs", "init", "--dir", str(pki), "--node", "n1"), check=True, capture_output=True)
    procs: list[Proc] = []
    try:
        sched = Proc("scheduler", persys("scheduler", "--listen", "127.0.0.1:0", "--store",
                                         f"sqlite:///{tmp / 'state.db'}", "--tls-dir", str(pki), "--data-dir",
                                         str(tmp / "scheduler"), "--node-grace", "120",
                                         # the hollow agents act for their nodes with the admin certificate
                                         "--node-simulator", "user:admin"), tmp)
        procs.append(sched)
        sched.wait_for("scheduler ready", timeout=60)
        m = re.search(r"scheduler ready on port (\d+)", sched.text())
        assert m
        target = f"127.0.0.1:{m.group(1)}"
        hollow = Proc("hollow", [sys.executable, str(REPO / "bench/scale/hollow.py"), "--scheduler", target,
                                 "--tls-dir", str(pki), "--nodes", str(args.nodes), "--control",
                                 str(tmp / "hollow.sock")], tmp)
        procs.append(hollow)
        gw = Proc("gateway", persys("gateway", "--scheduler", target, "--listen", "127.0.0.1:0", "--tls-dir",
                                    str(pki)), tmp)
        procs.append(gw)
        gw.wait_for("gateway ready", timeout=60)
        m = re.search(r"gateway ready on (https://127\.0\.0\.1:\d+)", gw.text())
        assert m
        url = m.group(1)
        import ssl

        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        admin = httpx.Client(base_url=url, verify=ctx, timeout=120)
        t0 = time.monotonic()
        eventually(lambda: admin.get("/v1/health").json().get("nodesReady", 0) >= args.nodes, 900,
                   f"{args.nodes} nodes Ready")
        print(f"{args.nodes} hollow nodes Ready in {time.monotonic() - t0:.0f}s", flush=True)
        t0 = time.monotonic()
        for at in range(0, args.workloads, args.batch):
            batch = [manifest(i) for i in range(at, min(at + args.batch, args.workloads))]
            for attempt in range(30):  # a busy scheduler's deadline: the batch again (applies are idempotent)
                r = admin.post("/v1/workloads:batch", json=batch)
                if r.status_code < 500 or attempt == 29:
                    break
                time.sleep(5)
            assert r.status_code == 200, r.text[:500]
        eventually(lambda: admin.get("/v1/health").json().get("workloads", 0) >= args.workloads, 900,
                   f"{args.workloads} workloads")
        print(f"{args.workloads} workloads applied in {time.monotonic() - t0:.0f}s", flush=True)
        token = admin.post("/v1/auth/tokens", json={"name": "bench", "role": "admin"}).json()["token"]
        ui = httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=str(pki / "ca.crt")), timeout=120)
        r = ui.post("/ui/signin", data={"token": token, "next": "/"}, headers={"origin": url})
        assert r.status_code == 303, r.text[:300]
        t0 = time.perf_counter()
        # The first: the gateway's live view reads every object once (a 503 "still reading" meanwhile).
        eventually(lambda: ui.get("/").status_code == 200, 900, "the first overview")
        print(f"first overview (the live view's initial read): {time.perf_counter() - t0:.1f} s", flush=True)
        print(f"{args.nodes} nodes, {args.workloads} workloads, {args.runs} runs (median / max ms, bytes):")
        first_node = admin.get("/v1/nodes", params={"limit": 1}).json()["items"][0]["id"]
        for path in ("/", "/ui/workloads?label=app%3Da7", "/ui/workloads?phase=Pending", "/ui/nodes?q=hollow-0001",
                     "/ui/topology", f"/ui/nodes/{first_node}", "/ui/workloads/w00007"):
            med, worst, size = timed(ui, path, args.runs)
            print(f"  GET {path:<34} {med:7.1f} / {worst:7.1f}  {size:>9,}", flush=True)
        # The worst overview under the load of a cluster at work: the same page asked again while the
        # hollow nodes keep reporting (the live view changing under it), with the machine's load.
        med, worst, _ = timed(ui, "/", args.runs * 4)
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"  GET / x{args.runs * 4} more: median {med:.1f} ms, worst {worst:.1f} ms (load average {load})")
        pauses = [x for x in gw.text().splitlines() if "garbage collection" in x]
        print(f"  gateway: {len(pauses)} garbage-collection pauses of 0.25 s or more logged", *pauses[-3:], sep="\n")
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # its store alone is ~0.9 GB at this scale


if __name__ == "__main__":
    main()
