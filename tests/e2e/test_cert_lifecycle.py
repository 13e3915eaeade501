"""Acceptance (issue #13, certificate lifecycle): scheduler and gateway processes bootstrap their
identities from a real OpenBao (AppRole, wrapped single-use secret ids) and renew them without a
restart, with 0 failed calls and no dropped stream, also across an OpenBao outage.

The outage is a SIGSTOP of the (private, in-memory dev) bao process: it keeps its sockets, so
requests hang until the renewal's timeout, as with a server cut off; SIGCONT brings it back with
its state (a restart would lose the dev server's memory). Certificates live 45 s here (renewed at
about 30 s); bench/cert_renewal.py runs the same with 2-minute certificates over 10 minutes.
"""

from __future__ import annotations

import asyncio
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.cert_lifecycle import Cluster, cluster, paused, renewal_failed, status_json, traffic

pytestmark = pytest.mark.e2e
TTL = 45
SAFETY = 8.0  # seconds of validity left when OpenBao comes back at the latest


async def _until(what: str, cond: Callable[[], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within:.0f} s")
        await asyncio.sleep(0.2)


async def _scenario(c: Cluster) -> None:
    async with traffic(c) as report:
        await _until("first heartbeat acknowledged", lambda: report.heartbeats_acked > 0, 20)
        with paused(c.bao):
            # The renewals come due while OpenBao is away: they fail and the services keep serving.
            # Back once both failed, or before a certificate gets near its expiry (on a slow machine the
            # gateway starts late enough that its renewal may come due only after that).
            await _until("renewals failed", lambda: (renewal_failed(c.scheduler, "scheduler")
                                                     and renewal_failed(c.gateway, "gateway"))
                         or c.seconds_left() < SAFETY, TTL)
            assert renewal_failed(c.scheduler, "scheduler")  # issued first, due first
            assert c.renewals("scheduler") == 0 and c.renewals("gateway") == 0
        await _until("both renewed after OpenBao came back",
                     lambda: c.renewals("scheduler") >= 1 and c.renewals("gateway") >= 1, TTL / 4)
        served = len(report.gateway_serials)
        await _until("a new handshake with the renewed gateway certificate",
                     lambda: len(report.gateway_serials) > served or served >= 2, 10)
        acked = report.heartbeats_acked
        await _until("heartbeats keep flowing on the same stream", lambda: report.heartbeats_acked >= acked + 2, 10)
    assert report.failures == [], report.failures[:5]
    assert report.stream_error == ""
    assert report.calls_ok > 50 and len(report.gateway_serials) >= 2


def test_renewals_without_restart_and_through_an_openbao_outage(tmp_path: Path) -> None:
    with cluster(tmp_path, TTL) as c:
        assert not any(w.exists() for w in c.wrapped)  # single-use secret ids: unwrapped and shredded
        asyncio.run(_scenario(c))
        # No long-lived files: the CA bundle and the current key and certificate of each process only.
        for service in ("scheduler", "gateway"):
            run = c.runtime(service)
            assert sorted(p.name for p in run.iterdir()) == sorted(["ca.crt", f"{service}.crt", f"{service}.key"])
            assert stat.S_IMODE((run / f"{service}.key").stat().st_mode) == 0o600
            assert stat.S_IMODE(run.stat().st_mode) == 0o700
        rows = status_json(c)
        sched = [r for r in rows if r["identity"] == "scheduler:scheduler"]
        assert len(sched) >= 2 and {r["signer"] for r in sched} == {"openbao"}
        assert any(r["identity"] == "gateway:gateway" for r in rows)  # from the PKI mount
        assert all(r["state"] in ("valid", "renewal-due") for r in rows)
        c.scheduler.stop()
        c.gateway.stop()
        for service in ("scheduler", "gateway"):  # a clean stop leaves only the CA bundle
            assert [p.name for p in c.runtime(service).iterdir()] == ["ca.crt"]
