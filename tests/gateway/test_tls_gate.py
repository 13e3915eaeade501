"""The gateway's bound on TLS connections (gateway.tls_gate): beyond --max-connections open or
handshaking, a new connection is refused at its ClientHello (before the costly part of the
handshake), and admitted again once one closes. The counting is table-driven with a
fake clock; the refusal runs against a real gateway with real TLS clients."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from pathlib import Path

import pytest

from persys.gateway.server import start_gateway
from persys.gateway.tls_gate import HandshakeGate
from persys.model.limits import GatewayLimits
from persys.security.pki import ClusterCA

# (step, expected admit result or None, open, handshaking) with max 2 and a 10 s handshake timeout.
CASES = [
    ("admit", True, 0, 1),
    ("admit", True, 0, 2),
    ("admit", False, 0, 2),        # two handshaking: full
    ("established", None, 1, 1),
    ("admit", False, 1, 1),        # one open + one handshaking: full
    ("closed", None, 0, 1),
    ("admit", True, 0, 2),
    ("wait 11", None, 0, 0),       # both abandoned: they stop counting after the timeout
    ("admit", True, 0, 1),
    ("closed", None, 0, 1),        # never below zero
]


def test_the_gate_counts_open_and_handshaking() -> None:
    now = [100.0]
    gate = HandshakeGate(2, handshake_timeout=10.0, clock=lambda: now[0])
    for step, admitted, open_, handshaking in CASES:
        if step == "admit":
            assert gate.admit() is admitted, step
        elif step.startswith("wait"):
            now[0] += float(step.split()[1])
        else:
            getattr(gate, step)()
        assert (gate.open, gate.handshaking()) == (open_, handshaking), (step, gate.open, gate.handshaking())
    assert gate.refused == 2


def _client(tmp: Path, ca: ClusterCA) -> ssl.SSLContext:
    user = ca.issue("user", "user:admin", groups=("persys:admins",), out=tmp / "user")
    ctx = ssl.create_default_context(cafile=str(user.ca))
    ctx.load_cert_chain(str(user.cert), str(user.key))
    return ctx


def _connect(ctx: ssl.SSLContext, port: int) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        return ctx.wrap_socket(sock, server_hostname="127.0.0.1")
    except BaseException:
        sock.close()
        raise


def _healthz(tls: ssl.SSLSocket) -> bytes:
    tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
    return tls.recv(4096)


def _hold(ctx: ssl.SSLContext, port: int) -> ssl.SSLSocket:
    """A connection the gateway has taken on (a request answered on it), kept open: a request
    begun and never finished (an idle kept-alive one would be closed after 5 s)."""
    tls = _connect(ctx, port)
    assert _healthz(tls).startswith(b"HTTP/1.1 200")
    tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n")
    return tls


async def test_beyond_the_bound_a_handshake_is_refused_then_admitted_again(tmp_path: Path) -> None:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    gw_files = ca.issue("gateway", "gateway", out=tmp_path / "gw")
    ctx = _client(tmp_path, ca)
    # No scheduler behind it: /healthz needs none.
    gw = await start_gateway("127.0.0.1:1", "127.0.0.1", 0, gw_files, GatewayLimits(max_connections=2))
    held: list[ssl.SSLSocket] = []
    try:
        for _ in range(2):
            held.append(await asyncio.to_thread(_hold, ctx, gw.port))
        # Refused: the handshake is aborted (asyncio closes the connection with or without the alert).
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.to_thread(_connect, ctx, gw.port)
        held.pop().close()
        t0 = time.monotonic()
        deadline = t0 + 120  # generous: the server must notice the close on a busy machine

        def try_again() -> bytes | None:
            try:
                tls = _connect(ctx, gw.port)
            except (ssl.SSLError, ConnectionError):
                return None
            held.append(tls)
            return _healthz(tls)

        answer = None
        while answer is None and time.monotonic() < deadline:
            answer = await asyncio.to_thread(try_again)
            if answer is None:
                await asyncio.sleep(0.1)
        assert answer is not None and answer.startswith(b"HTTP/1.1 200"), "admitted again after a close"
        print(f"admitted again {time.monotonic() - t0:.2f}s after a close")
    finally:
        for tls in held:
            tls.close()
        await gw.stop()
