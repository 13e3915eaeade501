"""Shedding instead of queueing, on real processes: a storm of 1,000 concurrent workload lists
against a gateway (its scheduler holding 300 workloads) is answered 200 or 503 + Retry-After,
never a 504 or a dropped connection; `/healthz` answers throughout; the gateway's memory returns
within 20 % of its baseline afterwards. The timings are printed (they belong to benchmarks and
are not asserted: on a busy 2-core machine the TLS handshakes of 1,000 connections alone take
seconds of the gateway's one event loop; docs/benchmarks.md has the figures)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from persys.gateway.shedding import is_exempt
from tests.e2e.harness import eventually
from tests.gateway.cluster import GatewayCluster, start_cluster

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_what_is_not_counted() -> None:
    assert is_exempt("/healthz", b"") and is_exempt("/readyz", b"") and is_exempt("/metrics", b"")
    assert is_exempt("/v1/watch/workloads", b"") and is_exempt("/v1/events/stream", b"")
    assert is_exempt("/ui/live", b"topics=overview")  # the dashboard's one stream per tab
    assert is_exempt("/v1/workloads/web/logs", b"follow=true&tail=10")
    assert not is_exempt("/v1/workloads/web/logs", b"tail=10")
    assert not is_exempt("/v1/workloads", b"") and not is_exempt("/v1/health", b"")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    c = start_cluster(tmp_path_factory.mktemp("storm"), with_agent=False)
    try:
        docs = [{"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": f"w-{i:03d}"},
                 "spec": {"type": "process", "process": {"command": ["sleep", "600"]},
                          "resources": {"cpuMillicores": 10, "memoryMb": 8}}} for i in range(300)]
        with c.client(timeout=120) as http:
            r = http.post("/v1/workloads:batch", json=docs)
            assert r.status_code in (200, 201), r.text
        yield c
    finally:
        c.stop()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_storm_of_lists_is_shed_not_queued(cluster: GatewayCluster) -> None:
    c = cluster
    with c.client() as http:  # warm: the first list fills the gateway's caches and pools
        for _ in range(3):
            assert http.get("/v1/workloads").status_code == 200
    baseline = _rss_mb(c.gateway.pid)
    probes: list[tuple[int, float]] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=c.url, verify=c.ssl_context(), timeout=30) as client:
            while not stop.is_set():
                t0 = time.monotonic()
                probes.append((client.get("/healthz").status_code, time.monotonic() - t0))
                time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        out = subprocess.run([sys.executable, "-m", "tests.gateway.storm_client", c.url, str(c.pki / "ca.crt"),
                              str(c.pki / "admin.crt"), str(c.pki / "admin.key"), "/v1/workloads", "1000"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT, check=True)
    finally:
        stop.set()
        prober.join(timeout=60)
    answers = [(int(s), float(t)) for s, t in json.loads(out.stdout)]
    statuses = {s for s, _ in answers}
    slowest = max(t for _, t in answers)
    refused = sum(1 for s, _ in answers if s == 503)
    print(f"storm: {len(answers)} answers, statuses {sorted(statuses)}, {refused} shed, slowest {slowest:.2f}s; "
          f"/healthz max {max(t for _, t in probes) * 1000:.0f} ms over {len(probes)} probes; "
          f"RSS baseline {baseline:.0f} MiB, peak now {_rss_mb(c.gateway.pid):.0f} MiB")
    assert statuses <= {200, 503}, sorted(statuses)  # no 504, no dropped connection (0)
    assert refused > 0, "1,000 at once were all queued, none shed"
    assert probes and {s for s, _ in probes} == {200}, "/healthz refused during the storm"
    with c.client() as http:  # after the storm: served again at once
        assert http.get("/v1/workloads").status_code == 200
    eventually(lambda: _rss_mb(c.gateway.pid) <= baseline * 1.2 + 8, timeout=30,
               what=f"the gateway's RSS back near its baseline ({baseline:.0f} MiB)")


def test_beyond_the_bound_is_a_503_with_retry_after() -> None:
    """Two requests in flight with a bound of one: the second is refused at once, naming the bound;
    the probe passes through whatever the load."""
    import asyncio

    from persys.gateway.shedding import Shedding

    release, entered = asyncio.Event(), asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] != "/healthz":
            entered.set()
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run() -> None:
        shed = Shedding(app, max_in_flight=1)
        transport = httpx.ASGITransport(app=shed)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            first = asyncio.create_task(client.get("/v1/workloads"))
            await entered.wait()
            second = await client.get("/v1/workloads")
            assert second.status_code == 503 and second.headers["retry-after"] == "1"
            assert "1 requests in flight (its limit is 1)" in second.json()["error"]
            assert (await client.get("/healthz")).status_code == 200
            release.set()
            assert (await first).status_code == 200
            assert shed.refused == 1 and shed.in_flight == 0

    asyncio.run(run())
