"""`persys gateway --health-listen`: /healthz in plain HTTP answered by a thread, from the event
loop's heartbeat: 200 while the loop keeps time, also while the API port is saturated (every
connection it takes held open), 503 "stalled" once the loop hangs past the bound. The verdict is
a pure function (table below); the listener runs against a real gateway."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from persys.gateway.health_listener import HealthListener, LoopBeat, verdict
from persys.gateway.server import start_gateway
from persys.model.limits import GatewayLimits
from persys.security.pki import ClusterCA
from tests.gateway.test_tls_gate import _client, _connect, _hold


@pytest.mark.parametrize(("lag", "status", "word"), [(0.0, 200, "ok"), (29.9, 200, "ok"), (30.0, 503, "stalled"),
                                                     (120.0, 503, "stalled")])
def test_verdict(lag: float, status: int, word: str) -> None:
    got, body = verdict(lag, 30.0)
    assert (got, body["status"], body["loopLagSeconds"]) == (status, word, lag)


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_healthz_answers_while_the_api_port_takes_no_more(tmp_path: Path) -> None:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ctx = _client(tmp_path, ca)
    gw = await start_gateway("127.0.0.1:1", "127.0.0.1", 0, ca.issue("gateway", "gateway", out=tmp_path / "gw"),
                             GatewayLimits(max_connections=1), health_listen=("127.0.0.1", 0))
    held = []
    try:
        assert gw.health is not None
        url = f"http://127.0.0.1:{gw.health.port}"
        held.append(await asyncio.to_thread(_hold, ctx, gw.port))  # the API port's one connection
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.to_thread(_connect, ctx, gw.port)
        status, body = await asyncio.to_thread(_get, f"{url}/healthz")
        assert status == 200 and body["status"] == "ok", body
        status, body = await asyncio.to_thread(_get, f"{url}/v1/workloads")
        assert status == 404 and "only /healthz" in str(body["error"])
    finally:
        for tls in held:
            tls.close()
        await gw.stop()


def test_a_hung_loop_is_answered_stalled() -> None:
    beat = LoopBeat(every=0.25)
    beat.last -= 100  # its loop has not beaten for 100 s (never run here: as good as hung)
    listener = HealthListener("127.0.0.1", 0, beat, stall_after=30.0)
    listener.start()
    try:
        status, body = _get(f"http://127.0.0.1:{listener.port}/healthz")
        assert status == 503 and body["status"] == "stalled" and float(str(body["loopLagSeconds"])) > 30
    finally:
        listener.stop()
