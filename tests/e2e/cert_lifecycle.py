"""A control plane whose identities come from OpenBao, exercised across certificate renewals.

Shared by tests/e2e/test_cert_lifecycle.py (short certificates, one pause) and
bench/cert_renewal.py (2-minute certificates over 10 minutes). Real processes: a private
`bao server -dev` (private, so pausing it with SIGSTOP touches no other test), `persys scheduler`
and `persys gateway` with `--identity-from openbao`. Meanwhile a client calls the gateway with a
fresh TLS connection per call (so each call handshakes with the gateway's current certificate and
the gateway's current channel to the scheduler), and a node holds one StreamUpdates stream open to
the scheduler, heartbeating every second: every heartbeat must be acknowledged on that stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from cryptography import x509

from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.security import bao_setup, peer_names
from persys.security.bao_signer import BaoSigner
from persys.security.cert_requests import identity_request
from persys.security.csr import new_key_and_csr
from persys.security.grpc_tls import secure_channel
from persys.security.vault_session import VaultSession
from persys.tlsfiles import TLSFiles
from tests.bao_server import BaoServer, start_bao
from tests.e2e.harness import GATEWAY_PORT, SCHEDULER_PORT, Proc, persys

RENEWED = "certificate for {cn}: serial"


@dataclass
class Cluster:
    tmp: Path
    bao: BaoServer
    scheduler: Proc
    gateway: Proc
    scheduler_port: int
    gateway_port: int
    node: TLSFiles  # the test's node identity, for the stream
    user: TLSFiles  # a user with no role, for the calls
    wrapped: list[Path]

    def runtime(self, service: str) -> Path:
        return self.tmp / f"{service}-run"

    def seconds_left(self) -> float:
        """Validity left of the certificate that expires first (read from the services' runtime dirs)."""
        ends = [x509.load_pem_x509_certificate((self.runtime(s) / f"{s}.crt").read_bytes()).not_valid_after_utc
                for s in ("scheduler", "gateway")]
        return min(ends).timestamp() - time.time()

    def renewals(self, service: str) -> int:
        """Certificates obtained after the first (each process logs one line per certificate)."""
        proc = self.scheduler if service == "scheduler" else self.gateway
        return proc.text().count(RENEWED.format(cn=service)) - 1


def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _service(tmp: Path, bao: BaoServer, service: str, role_id: str, ttl: int, extra: list[str]) -> tuple[Proc, Path]:
    wrapped = _write(tmp / f"{service}.wrapped", bao_setup.wrapped_secret_id(bao.client(), service, "5m").encode())
    role_file = _write(tmp / f"{service}.role-id", role_id.encode())
    argv = persys(service, *extra, "--identity-from", "openbao", "--vault-addr", bao.url,
                  "--vault-role-id-file", str(role_file), "--vault-wrapped-secret-id-file", str(wrapped),
                  "--cert-ttl", str(ttl), "--cert-host", "127.0.0.1", "--cert-host", "localhost",
                  "--runtime-dir", str(tmp / f"{service}-run"))
    return Proc(service, argv, tmp), wrapped


async def _client_identity(tmp: Path, bao: BaoServer, role: str, name: str, hosts: tuple[str, ...]) -> TLSFiles:
    """The test's own identities (a node for the stream, a user for the calls), signed with the root
    token as a join or an operator would."""
    signer = BaoSigner(VaultSession(bao.url, None, token=bao.root_token))
    key, csr = new_key_and_csr(name)
    signed = await signer.sign(csr, identity_request(role, name, hosts, ()), dt.timedelta(hours=1))
    d = tmp / role
    d.mkdir()
    return TLSFiles(_write(d / "ca.crt", signed.ca_bundle_pem, 0o644), _write(d / "id.crt", signed.certificate_pem),
                    _write(d / "id.key", key))


@contextlib.contextmanager
def cluster(tmp: Path, ttl: int) -> Iterator[Cluster]:
    bao = start_bao(tmp)
    procs: list[Proc] = []
    try:
        role_ids = bao_setup.configure(bao.client(), bao_setup.SetupOptions())
        sched, w1 = _service(tmp, bao, "scheduler", role_ids["scheduler"], ttl, [
            "--listen", "127.0.0.1:0", "--store", f"sqlite:///{tmp / 'state.db'}", "--data-dir", str(tmp / "data")])
        procs.append(sched)
        sport = sched.bound_port(SCHEDULER_PORT, timeout=60)
        gw, w2 = _service(tmp, bao, "gateway", role_ids["gateway"], ttl, [
            "--scheduler", f"127.0.0.1:{sport}", "--listen", "127.0.0.1:0"])
        procs.append(gw)
        gport = gw.bound_port(GATEWAY_PORT, timeout=60)
        node = asyncio.run(_client_identity(tmp, bao, "node", "n1", ("127.0.0.1",)))
        user = asyncio.run(_client_identity(tmp, bao, "user", "probe", ()))
        yield Cluster(tmp, bao, sched, gw, sport, gport, node, user, [w1, w2])
    finally:
        for p in reversed(procs):
            p.stop()
        if bao.proc.poll() is None:
            os.kill(bao.pid, signal.SIGCONT)  # never leave it stopped
        bao.stop()


@dataclass
class Report:
    calls_ok: int = 0
    failures: list[str] = field(default_factory=list)
    heartbeats_acked: int = 0
    stream_error: str = ""
    gateway_serials: list[str] = field(default_factory=list)  # in the order they were first served


async def _call_gateway(c: Cluster, report: Report) -> None:
    """`whoami` as a user with no role (any user may ask about itself): TLS to the gateway, then the
    gateway's channel to the scheduler (WhoAmI), so both processes' certificates are on the path."""
    ctx = ssl.create_default_context(cafile=str(c.user.ca))
    ctx.load_cert_chain(c.user.cert, c.user.key)
    # A new connection per call: each one is a new handshake with the gateway's current certificate.
    async with httpx.AsyncClient(verify=ctx, timeout=10) as client:
        r = await client.get(f"https://127.0.0.1:{c.gateway_port}/v1/auth/whoami",
                             extensions={"sni_hostname": peer_names.GATEWAY})
        ssl_obj = r.extensions["network_stream"].get_extra_info("ssl_object")
        der = ssl_obj.getpeercert(True) if ssl_obj is not None else None
    if r.status_code != 200 or r.json().get("principal") != "user:probe":
        report.failures.append(f"whoami {r.status_code} {r.text[:200]}")
        return
    if der:
        serial = format(x509.load_der_x509_certificate(der).serial_number, "x")
        if serial not in report.gateway_serials:
            report.gateway_serials.append(serial)
    report.calls_ok += 1


async def _heartbeats(c: Cluster, report: Report, stop: asyncio.Event) -> None:
    async with secure_channel(f"127.0.0.1:{c.scheduler_port}", c.node, expect=peer_names.SCHEDULER) as ch:
        stub = pb_grpc.AgentControlStub(ch)
        await stub.RegisterNode(pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:1"), timeout=20)
        call = stub.StreamUpdates()
        try:
            while not stop.is_set():
                await call.write(pb.AgentUpdate(heartbeat=pb.HeartbeatRequest(node_id="n1")))
                ack = await asyncio.wait_for(call.read(), 20)
                if ack is grpc.aio.EOF or not ack.heartbeat.acknowledged:
                    report.stream_error = f"stream ended or heartbeat refused: {ack}"
                    return
                report.heartbeats_acked += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        except (grpc.aio.AioRpcError, TimeoutError) as e:
            report.stream_error = f"{type(e).__name__}: {e}"
        finally:
            call.cancel()


@contextlib.asynccontextmanager
async def traffic(c: Cluster, interval: float = 0.25) -> AsyncIterator[Report]:
    """While inside: a gateway call every `interval` s and a heartbeat a second on one stream."""
    report, stop = Report(), asyncio.Event()

    async def calls() -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            try:
                await _call_gateway(c, report)
            except (httpx.HTTPError, OSError) as e:
                report.failures.append(f"{time.monotonic() - t0:.1f}s {type(e).__name__}: {e}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    tasks = [asyncio.create_task(calls()), asyncio.create_task(_heartbeats(c, report, stop))]
    try:
        yield report
    finally:
        stop.set()
        await asyncio.gather(*tasks)


@contextlib.contextmanager
def paused(bao: BaoServer) -> Iterator[None]:
    """OpenBao stopped (SIGSTOP: the process holds its sockets, requests hang as if it were cut off)."""
    os.kill(bao.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(bao.pid, signal.SIGCONT)


def renewal_failed(proc: Proc, service: str) -> bool:
    return f"renewing the certificate of {service} failed" in proc.text()


def status_json(c: Cluster) -> list[dict[str, object]]:
    """`persys certs status --json` from the scheduler's store and the PKI mount (in-process: the
    command's own code, without another interpreter's start-up)."""
    from typer.testing import CliRunner

    from persys.cli.servers.certs_cmds import certs_app

    out = CliRunner().invoke(certs_app, ["status", "--store", f"sqlite:///{c.tmp / 'state.db'}", "--vault-addr",
                                         c.bao.url, "--json"], env={"VAULT_TOKEN": c.bao.root_token})
    assert out.exit_code == 0, out.output
    rows: list[dict[str, object]] = json.loads(out.output)
    return rows
