"""An overloaded scheduler is answered quickly with 503 + Retry-After, never a late 504 (issue #31):
the gateway bounds its calls to the scheduler (a few in flight, a bounded queue, bounded waits:
gateway.scheduler_gate) and gives each API read an answer budget (gateway.read_budget).

On real processes the most overloaded scheduler there is, a frozen one (SIGSTOP: its socket
still accepts, nothing answers), gets a storm of reads: each is a 503 with Retry-After naming the
overload (before: each waited the call's 10 s timeout, then 504), /healthz and the health listener
answer throughout, a write still waits for its outcome (504: it may have applied), and once the
scheduler runs again reads are served. Timings are printed, not asserted (bench/gateway_storm.py
measures them under a storm)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator

import httpx
import pytest

from persys.client import SchedulerError
from persys.gateway.read_budget import has_budget
from persys.gateway.scheduler_gate import SchedulerGate
from tests.e2e.harness import eventually
from tests.gateway.cluster import GatewayCluster, start_cluster


def test_which_requests_get_the_read_budget() -> None:
    assert has_budget("GET", "/v1/workloads", b"") and has_budget("HEAD", "/v1/nodes/n1", b"")
    assert not has_budget("POST", "/v1/workloads", b"")  # a write waits for its outcome
    assert not has_budget("GET", "/healthz", b"") and not has_budget("GET", "/readyz", b"")
    assert not has_budget("GET", "/v1/watch/workloads", b"")  # streams live as long as their client
    assert not has_budget("GET", "/v1/workloads/w/logs", b"follow=true")
    assert not has_budget("GET", "/ui/nodes", b"")  # the dashboard shows older data instead


def test_the_gate_bounds_calls_queue_and_waits() -> None:
    """One slot, one waiter: a second call waits (bounded) and is shed when no slot comes; a third,
    with one already waiting, is shed at once; a call whose answer budget is spent is not queued;
    the gate stays `busy` (reads past their budget are shed) for its memory after it was full."""

    async def run() -> None:
        gate = SchedulerGate(max_calls=1, max_waiting=1, wait_s=0.3, memory_s=3600)
        release, holding = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with gate.slot(None):
                holding.set()
                await release.wait()

        first = asyncio.create_task(hold())
        await holding.wait()
        waiter = asyncio.create_task(_enter(gate, None))
        await _until(lambda: gate.waiting == 1)
        third = await _enter(gate, None)  # the queue is full: refused without waiting
        assert isinstance(third, SchedulerError) and third.retry_after == 1 and "1 waiting" in third.message
        spent = await _enter(gate, time.monotonic() - 1)  # its request's budget is gone
        assert isinstance(spent, SchedulerError) and spent.code == "UNAVAILABLE"
        shed = await waiter  # no slot within wait_s
        assert isinstance(shed, SchedulerError) and "no call to it could start within 0.3s" in shed.message
        release.set()
        await first
        assert await _enter(gate, None) is None and gate.in_flight == 0 and gate.shed == 3
        assert gate.busy and not gate.stalled  # full a moment ago: remembered; but calls come back
        assert not SchedulerGate(max_calls=1, memory_s=3600).busy  # never full
        stuck = SchedulerGate(max_calls=1, max_waiting=0, memory_s=3600, stall_s=0)
        async with stuck.slot(None):  # the one call in flight never comes back (stall_s 0: at once)
            assert stuck.stalled

    asyncio.run(run())


async def _enter(gate: SchedulerGate, answer_by: float | None) -> SchedulerError | None:
    try:
        async with gate.slot(answer_by):
            return None
    except SchedulerError as err:
        return err


async def _until(ok: Callable[[], bool]) -> None:
    for _ in range(10_000):  # bounded: the condition holds after a few loop turns
        if ok():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    c = start_cluster(tmp_path_factory.mktemp("overload"), with_agent=False,
                      gateway_args=("--health-listen", "127.0.0.1:0", "--read-budget", "1.5"))
    try:
        yield c
    finally:
        c.stop()


async def _storm(c: GatewayCluster, n: int, rounds: int) -> list[tuple[int, str, str, float]]:
    """`n` clients at once, each asking `rounds` times in a row (as clients retry)."""
    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(base_url=c.url, verify=c.ssl_context(), limits=limits, timeout=120) as client:
        async def one() -> list[tuple[int, str, str, float]]:
            out = []
            for _ in range(rounds):
                t0 = time.monotonic()
                r = await client.get("/v1/workloads")
                out.append((r.status_code, r.headers.get("retry-after", ""), r.text, time.monotonic() - t0))
            return out
        return [a for answers in await asyncio.gather(*(one() for _ in range(n))) for a in answers]


def test_a_frozen_scheduler_is_answered_503_retry_after_not_504(cluster: GatewayCluster) -> None:
    c = cluster
    with c.client() as http:
        assert http.get("/v1/workloads").status_code == 200
    m = re.search(r"/healthz: (http://\S+/healthz)", c.gateway.text())
    assert m, "the gateway prints its health listener's address"
    os.kill(c.scheduler.pid, signal.SIGSTOP)
    try:
        got = asyncio.run(_storm(c, 40, 3))  # more than the gate's 2 slots: some are queued, some shed
        statuses = sorted({s for s, _, _, _ in got})
        print(f"frozen scheduler, {len(got)} reads: statuses {statuses}, slowest {max(t for *_, t in got):.2f}s")
        assert statuses == [503], statuses  # before: every one a 504, after the 10 s call timeout
        assert all(ra == "1" and "overloaded" in text for _, ra, text, _ in got)
        with urllib.request.urlopen(m.group(1), timeout=60) as r:  # the health listener's thread
            assert r.status == 200
        with c.client(timeout=120) as http:
            assert http.get("/healthz").status_code == 200  # probes never wait behind API work
            # A write is not cut short: it may apply, so its caller waits for the outcome.
            w = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "late"},
                 "spec": {"type": "process", "process": {"command": ["sleep", "60"]}}}
            assert http.post("/v1/workloads", json=w).status_code == 504
    finally:
        os.kill(c.scheduler.pid, signal.SIGCONT)
    with c.client(timeout=60) as http:
        eventually(lambda: http.get("/v1/workloads").status_code == 200, 60, "reads served again")
