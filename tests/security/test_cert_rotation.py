"""CA rotation with overlap on a real OpenBao and an in-process scheduler over real gRPC/mTLS.

The scheduler serves with a renewing identity (`LiveIdentity` + `grpc_reload`): during the
overlap certificates of the old and the new CA are both accepted; after the old issuer is
dropped and the scheduler renewed, only the new CA's are, while a connection opened before
keeps working (established connections are never cut by a reload).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509

from persys.client import SchedulerClient, SchedulerError
from persys.scheduler.server import RunningScheduler, start_scheduler
from persys.security import bao_setup
from persys.security.bao_signer import BaoSigner
from persys.security.cert_requests import identity_request
from persys.security.csr import new_key_and_csr
from persys.security.grpc_reload import reloading_server_credentials
from persys.security.live_identity import LiveIdentity
from persys.security.vault_session import VaultSession
from persys.tlsfiles import TLSFiles
from tests.bao_server import BaoServer

TTL = dt.timedelta(minutes=10)


async def _user(signer: BaoSigner, name: str, folder: Path, bundle: bytes) -> TLSFiles:
    """A user certificate (no groups: `whoami` needs none) from the mount's default issuer."""
    key, csr = new_key_and_csr(name)
    signed = await signer.sign(csr, identity_request("user", name, (), ()), TTL)
    return _write(folder, bundle, signed.certificate_pem, key)


def _write(folder: Path, ca: bytes, cert: bytes, key: bytes) -> TLSFiles:
    folder.mkdir()
    files = TLSFiles(folder / "ca.crt", folder / "u.crt", folder / "u.key")
    files.ca.write_bytes(ca)
    files.cert.write_bytes(cert)
    files.key.write_bytes(key)
    return files


async def _whoami(port: int, files: TLSFiles) -> str:
    client = SchedulerClient(f"127.0.0.1:{port}", files, timeout=5)
    try:
        return str((await client.whoami())["principal"])
    finally:
        await client.close()


def _trust(files: TLSFiles, bundle: bytes) -> None:
    files.ca.write_bytes(bundle)


@pytest.fixture
async def served(bao_server: BaoServer, tmp_path: Path) -> AsyncIterator[tuple[RunningScheduler, LiveIdentity, str]]:
    mount = f"pki-{uuid.uuid4().hex[:8]}"
    bao_setup.configure(bao_server.client(), bao_setup.SetupOptions(mount, f"approle-{uuid.uuid4().hex[:8]}"))
    signer = BaoSigner(VaultSession(bao_server.url, None, token=bao_server.root_token), mount)
    live = LiveIdentity(signer, identity_request("scheduler", "", ("localhost", "127.0.0.1"), ()), TTL,
                        tmp_path / "run")
    await live.start()
    s = await start_scheduler(f"sqlite:///{tmp_path / 'state.db'}", "memory://", "127.0.0.1:0", live.files,
                              credentials=reloading_server_credentials(lambda: live.current))
    yield s, live, mount
    await s.stop()
    await live.stop()


async def test_old_and_new_ca_accepted_during_overlap_old_dropped_after(
        served: tuple[RunningScheduler, LiveIdentity, str], bao_server: BaoServer, tmp_path: Path) -> None:
    s, live, mount = served
    signer = live.signer
    assert isinstance(signer, BaoSigner)
    old_issuer = bao_setup.issuers(bao_server.client(), mount)[0]["id"]
    alice = await _user(signer, "alice", tmp_path / "alice", live.current.ca_pem)  # old CA
    assert await _whoami(s.port, alice) == "user:alice"
    before = SchedulerClient(f"127.0.0.1:{s.port}", alice, timeout=5)
    assert (await before.whoami())["principal"] == "user:alice"  # a connection made before the rotation

    bao_setup.rotate_ca(bao_server.client(), mount, "persys CA 2")
    await live.renew_now()  # the scheduler's next renewal: new CA's certificate, bundle of both
    assert len(x509.load_pem_x509_certificates(live.current.ca_pem)) == 2
    bob = await _user(signer, "bob", tmp_path / "bob", live.current.ca_pem)  # new CA
    assert x509.load_pem_x509_certificate(bob.cert.read_bytes()).issuer != \
        x509.load_pem_x509_certificate(alice.cert.read_bytes()).issuer
    _trust(alice, live.current.ca_pem)  # clients get the bundle too (they trust the new server cert)
    assert await _whoami(s.port, alice) == "user:alice"  # overlap: old CA's certificate accepted
    assert await _whoami(s.port, bob) == "user:bob"  # and the new one's

    bao_setup.drop_issuer(bao_server.client(), mount, old_issuer)
    await live.renew_now()
    assert len(x509.load_pem_x509_certificates(live.current.ca_pem)) == 1
    with pytest.raises(SchedulerError) as refused:  # new handshakes no longer trust the old CA
        await _whoami(s.port, alice)
    assert refused.value.code == "UNAVAILABLE"
    assert await _whoami(s.port, bob) == "user:bob"
    assert (await before.whoami())["principal"] == "user:alice"  # established connections are kept
    await before.close()
