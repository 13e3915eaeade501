"""CA rotation with overlap on a real OpenBao, with an in-process scheduler (gRPC/mTLS) and gateway
(HTTPS) serving renewing identities (`LiveIdentity`; `grpc_reload`, `gateway.tls_reload`).

During the overlap certificates of the old and the new CA are both accepted; after the old issuer
is dropped and the services renewed, only the new CA's are, at the scheduler and at the gateway,
while a connection opened before keeps working (a reload never cuts established connections).
"""

from __future__ import annotations

import datetime as dt
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from persys.client import SchedulerClient, SchedulerError
from persys.gateway.server import RunningGateway, start_gateway
from persys.scheduler.rpc.server import RunningScheduler, start_scheduler
from persys.security import bao_setup, peer_names
from persys.security.bao_signer import BaoSigner
from persys.security.cert_requests import identity_request
from persys.security.csr import new_key_and_csr
from persys.security.grpc_reload import reloading_server_credentials
from persys.security.live_identity import LiveIdentity, Material
from persys.security.vault_session import VaultSession
from persys.tlsfiles import TLSFiles
from tests.bao_server import BaoServer

TTL = dt.timedelta(minutes=10)


@dataclass
class Served:
    scheduler: RunningScheduler
    gateway: RunningGateway
    sched_id: LiveIdentity
    gw_id: LiveIdentity
    signer: BaoSigner
    mount: str

    async def renew_both(self) -> bytes:
        await self.sched_id.renew_now()
        await self.gw_id.renew_now()
        return self.sched_id.current.ca_pem


def _write(folder: Path, ca: bytes, cert: bytes, key: bytes) -> TLSFiles:
    folder.mkdir()
    files = TLSFiles(folder / "ca.crt", folder / "u.crt", folder / "u.key")
    files.ca.write_bytes(ca)
    files.cert.write_bytes(cert)
    files.key.write_bytes(key)
    return files


def _trust(files: TLSFiles, bundle: bytes) -> None:
    files.ca.write_bytes(bundle)


async def _user(signer: BaoSigner, name: str, folder: Path, bundle: bytes) -> TLSFiles:
    """A user certificate (no groups: `whoami` needs none) from the mount's default issuer."""
    key, csr = new_key_and_csr(name)
    signed = await signer.sign(csr, identity_request("user", name, (), ()), TTL)
    return _write(folder, bundle, signed.certificate_pem, key)


async def _via_scheduler(port: int, files: TLSFiles) -> str:
    client = SchedulerClient(f"127.0.0.1:{port}", files, timeout=5)
    try:
        return str((await client.whoami())["principal"])
    finally:
        await client.close()


async def _via_gateway(port: int, files: TLSFiles) -> str:
    """whoami over HTTPS (a new handshake), then the gateway's own channel to the scheduler."""
    ctx = ssl.create_default_context(cafile=str(files.ca))
    ctx.load_cert_chain(files.cert, files.key)
    async with httpx.AsyncClient(verify=ctx, timeout=10) as client:
        r = await client.get(f"https://127.0.0.1:{port}/v1/auth/whoami",
                             extensions={"sni_hostname": peer_names.GATEWAY})
    assert r.status_code == 200, r.text
    return str(r.json()["principal"])


@pytest.fixture
async def served(bao_server: BaoServer, tmp_path: Path) -> AsyncIterator[Served]:
    mount = f"pki-{uuid.uuid4().hex[:8]}"
    bao_setup.configure(bao_server.client(), bao_setup.SetupOptions(mount, f"approle-{uuid.uuid4().hex[:8]}"))
    signer = BaoSigner(VaultSession(bao_server.url, None, token=bao_server.root_token), mount)
    hosts = ("localhost", "127.0.0.1")
    sched_id = LiveIdentity(signer, identity_request("scheduler", "", hosts, ()), TTL, tmp_path / "sched-run")
    gw_id = LiveIdentity(signer, identity_request("gateway", "", hosts, ()), TTL, tmp_path / "gw-run")
    await sched_id.start()
    await gw_id.start()
    s = await start_scheduler(f"sqlite:///{tmp_path / 'state.db'}", "memory://", "127.0.0.1:0", sched_id.files,
                              credentials=reloading_server_credentials(lambda: sched_id.current))
    gw = await start_gateway(f"127.0.0.1:{s.port}", "127.0.0.1", 0, gw_id.files)

    async def reload(_m: Material) -> None:
        await gw.reload_tls()

    gw_id.on_change(reload)
    yield Served(s, gw, sched_id, gw_id, signer, mount)
    await gw.stop()
    await s.stop()
    await gw_id.stop()
    await sched_id.stop()


async def test_old_and_new_ca_accepted_during_overlap_old_dropped_after(
        served: Served, bao_server: BaoServer, tmp_path: Path) -> None:
    sp, gp = served.scheduler.port, served.gateway.port
    old_issuer = bao_setup.issuers(bao_server.client(), served.mount)[0]["id"]
    alice = await _user(served.signer, "alice", tmp_path / "alice", served.sched_id.current.ca_pem)  # old CA
    assert await _via_scheduler(sp, alice) == "user:alice"
    assert await _via_gateway(gp, alice) == "user:alice"
    before = SchedulerClient(f"127.0.0.1:{sp}", alice, timeout=5)
    assert (await before.whoami())["principal"] == "user:alice"  # a connection made before the rotation

    bao_setup.rotate_ca(bao_server.client(), served.mount, "persys CA 2")
    both = await served.renew_both()  # the services' next renewal: the new CA's certificates, a bundle of both
    assert len(x509.load_pem_x509_certificates(both)) == 2
    bob = await _user(served.signer, "bob", tmp_path / "bob", both)  # new CA
    assert x509.load_pem_x509_certificate(bob.cert.read_bytes()).issuer != \
        x509.load_pem_x509_certificate(alice.cert.read_bytes()).issuer
    _trust(alice, both)  # clients get the bundle too (they must trust the new server certificates)
    for via in (_via_scheduler, _via_gateway):  # the overlap: both CAs' certificates accepted
        assert await via(sp if via is _via_scheduler else gp, alice) == "user:alice"
        assert await via(sp if via is _via_scheduler else gp, bob) == "user:bob"

    bao_setup.drop_issuer(bao_server.client(), served.mount, old_issuer)
    new_only = await served.renew_both()
    assert len(x509.load_pem_x509_certificates(new_only)) == 1
    with pytest.raises(SchedulerError) as refused:  # new handshakes no longer trust the old CA
        await _via_scheduler(sp, alice)
    assert refused.value.code == "UNAVAILABLE"
    with pytest.raises(httpx.HTTPError):
        await _via_gateway(gp, alice)
    _trust(bob, new_only)  # bob trusts the new CA alone: both services serve the new CA's certificates
    assert await _via_scheduler(sp, bob) == "user:bob"
    assert await _via_gateway(gp, bob) == "user:bob"
    assert (await before.whoami())["principal"] == "user:alice"  # established connections are kept
    await before.close()
