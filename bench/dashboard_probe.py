"""The dashboard overview's server time on a gateway that is already running (for example the
one bench/dashboard_scale.py started, while its workloads are still being applied: the worst
case, the live view changing under every page). Creates an admin token with the admin
certificate of --tls-dir, signs a session in with it, asks for the overview --runs times and
prints the median, p90 and max (ms), the cluster's size and the machine's load.

    .venv/bin/python bench/dashboard_probe.py --url https://127.0.0.1:PORT --tls-dir DIR [--runs 60]
"""

from __future__ import annotations

import argparse
import ssl
import statistics
import time
import uuid
from pathlib import Path

import httpx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--tls-dir", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--path", default="/")
    args = ap.parse_args()
    pki: Path = args.tls_dir
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    admin = httpx.Client(base_url=args.url, verify=ctx, timeout=120)
    for attempt in range(20):  # a busy scheduler's deadline: asked again
        answer = admin.post("/v1/auth/tokens", json={"name": f"probe-{uuid.uuid4().hex[:6]}", "role": "admin"})
        if answer.status_code < 500 or attempt == 19:
            break
        time.sleep(3)
    token = answer.json()["token"]
    ui = httpx.Client(base_url=args.url, verify=ssl.create_default_context(cafile=str(pki / "ca.crt")), timeout=120)
    for attempt in range(20):  # likewise (the sign-in asks the scheduler who the token is)
        r = ui.post("/ui/signin", data={"token": token, "next": "/"}, headers={"origin": args.url})
        if r.status_code == 303 or attempt == 19:
            break
        time.sleep(3)
    assert r.status_code == 303, r.text[r.text.find("<main"):][:600]
    t0 = time.perf_counter()
    while ui.get(args.path).status_code != 200:  # the live view's first read (503 meanwhile)
        time.sleep(1)
    print(f"first page after {time.perf_counter() - t0:.1f} s")
    took = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        r = ui.get(args.path)
        took.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, r.text[:300]
    h = admin.get("/v1/health").json()  # the size, as far as a busy scheduler answers in time
    took.sort()
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"GET {args.path} x{args.runs} at {h.get('nodesReady', '?')} nodes Ready, {h.get('workloads', '?')} "
          "workloads: median "
          f"{statistics.median(took):.1f} ms, p90 {took[int(len(took) * 0.9) - 1]:.1f} ms, max {took[-1]:.1f} ms "
          f"(load average {' '.join(load)})")


if __name__ == "__main__":
    main()
