"""The OpenBao signer, vault-setup and AppRole bootstrap against a real OpenBao (tests/bao_server.py).

Each module run configures its own uuid-named PKI and AppRole mounts on the session server.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from persys.security import bao_setup, peer_names
from persys.security.bao_signer import BaoSigner
from persys.security.cert_requests import identity_request
from persys.security.csr import new_key_and_csr
from persys.security.identity import Kind, from_certificate
from persys.security.pki import CertificateRequestError
from persys.security.vault_session import VaultLoginError, VaultSession, unwrap_secret_id
from tests.bao_server import BaoServer

TTL = dt.timedelta(minutes=5)


@dataclass
class Setup:
    server: BaoServer
    opts: bao_setup.SetupOptions
    role_ids: dict[str, str]

    def wrapped(self, service: str, path: Path) -> Path:
        path.write_text(bao_setup.wrapped_secret_id(self.server.client(), service, "5m", self.opts.approle_mount))
        return path

    def login(self, service: str, tmp: Path) -> VaultSession:
        secret = unwrap_secret_id(self.server.url, None, self.wrapped(service, tmp / f"{service}.wrapped"), "--f")
        return VaultSession(self.server.url, None, approle=(self.role_ids[service], secret),
                            approle_mount=self.opts.approle_mount)


@pytest.fixture(scope="module")
def setup(bao_server: BaoServer) -> Setup:
    tag = uuid.uuid4().hex[:8]
    opts = bao_setup.SetupOptions(f"pki-{tag}", f"approle-{tag}",
                                  hosts={Kind.SCHEDULER: ("localhost", "*.sched.example"),
                                         Kind.GATEWAY: ("localhost",), Kind.NODE: ("*.nodes.example",)})
    return Setup(bao_server, opts, bao_setup.configure(bao_server.client(), opts))


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _names(cert: x509.Certificate) -> set[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(san.get_values_for_type(x509.DNSName)) | {str(i) for i in san.get_values_for_type(x509.IPAddress)}


def test_setup_is_idempotent(setup: Setup) -> None:
    again = bao_setup.configure(setup.server.client(), setup.opts)
    assert again == setup.role_ids
    assert len(bao_setup.issuers(setup.server.client(), setup.opts.pki_mount)) == 1


@pytest.mark.parametrize(("role", "name", "hosts", "usages"), [
    ("scheduler", "", ("a.sched.example", "127.0.0.1"), {"serverAuth", "clientAuth"}),
    ("gateway", "gw1", ("localhost",), {"serverAuth", "clientAuth"}),
    ("node", "node-a", ("node-a.nodes.example",), {"serverAuth", "clientAuth"}),
    ("user", "alice", (), {"clientAuth"}),
])
async def test_identity_comes_out_as_persys_reads_it(setup: Setup, role: str, name: str, hosts: tuple[str, ...],
                                                     usages: set[str]) -> None:
    signer = BaoSigner(VaultSession(setup.server.url, None, token=setup.server.root_token), setup.opts.pki_mount)
    key_pem, csr = new_key_and_csr("scheduler")  # the CSR's name is ignored
    request = identity_request(role, name, hosts, ())
    signed = await signer.sign(csr, request, TTL)
    cert = _cert(signed.certificate_pem)
    identity = from_certificate(cert)
    assert identity.principal == f"{role}:{name or role}"
    key = serialization.load_pem_private_key(key_pem, None)
    assert cert.public_key() == key.public_key()  # the key never left: only the CSR did
    eku = {o._name for o in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value}
    assert eku == usages
    if role != "user":
        assert _names(cert) == {*hosts, peer_names.for_identity(identity)}
    lifetime = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(minutes=4) < lifetime <= TTL
    assert signed.serial == format(cert.serial_number, "x")
    assert _cert(signed.ca_bundle_pem).subject == cert.issuer


async def test_roles_refuse_names_of_other_roles(setup: Setup) -> None:
    signer = BaoSigner(VaultSession(setup.server.url, None, token=setup.server.root_token), setup.opts.pki_mount)
    _, csr = new_key_and_csr("x")
    with pytest.raises(CertificateRequestError, match="not allowed"):  # a host the node role does not allow
        await signer.sign(csr, identity_request("node", "n1", ("evil.example",), ()), TTL)


async def test_approle_policies_are_least_privilege(setup: Setup, tmp_path: Path) -> None:
    _, csr = new_key_and_csr("x")
    sched = BaoSigner(setup.login("scheduler", tmp_path), setup.opts.pki_mount)
    gw = BaoSigner(setup.login("gateway", tmp_path), setup.opts.pki_mount)
    await sched.sign(csr, identity_request("scheduler", "", ("localhost",), ()), TTL)
    await sched.sign(csr, identity_request("node", "n1", ("n1.nodes.example",), ()), TTL)  # it admits nodes
    await gw.sign(csr, identity_request("gateway", "", ("localhost",), ()), TTL)
    for signer, role, name in ((gw, "node", "n1"), (gw, "scheduler", ""), (sched, "gateway", "")):
        with pytest.raises(CertificateRequestError, match="policy does not allow"):
            await signer.sign(csr, identity_request(role, name, ("localhost",), ()), TTL)


def test_wrapped_secret_id_is_single_use_and_shredded(setup: Setup, tmp_path: Path) -> None:
    wrapped = setup.wrapped("gateway", tmp_path / "sid")
    token = wrapped.read_text()
    assert unwrap_secret_id(setup.server.url, None, wrapped, "--vault-wrapped-secret-id-file")
    assert not wrapped.exists()
    wrapped.write_text(token)  # a copy taken before use (an interception) is worthless
    with pytest.raises(VaultLoginError, match="already used or has expired"):
        unwrap_secret_id(setup.server.url, None, wrapped, "--vault-wrapped-secret-id-file")


async def test_session_logs_in_again_when_its_token_is_revoked(setup: Setup, tmp_path: Path) -> None:
    session = setup.login("gateway", tmp_path)
    token: Any = session.call(lambda c: c.token)
    setup.server.client().auth.token.revoke(token)  # as if it expired
    _, csr = new_key_and_csr("x")
    signed = await BaoSigner(session, setup.opts.pki_mount).sign(
        csr, identity_request("gateway", "", ("localhost",), ()), TTL)
    assert signed.serial and session.call(lambda c: c.token) != token


# ---------------------------------------------------------------- the command line: one-line errors

def _persys(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`persys ARGS` in-process; a ServerError becomes the one line `persys` prints for it (cli.servers.app.main)."""
    from typer.testing import CliRunner

    from persys.cli.servers.app import app
    from persys.cli.servers.errors import ServerError

    result = CliRunner().invoke(app, list(args), env=env)
    if isinstance(result.exception, ServerError):
        return 1, f"error: {result.exception}\n"
    return result.exit_code, result.output


def test_a_used_wrapped_secret_id_stops_the_service_with_one_line(setup: Setup, tmp_path: Path) -> None:
    wrapped = setup.wrapped("scheduler", tmp_path / "sid")
    token = wrapped.read_text()
    unwrap_secret_id(setup.server.url, None, wrapped, "--f")  # someone used it first
    wrapped.write_text(token)
    role_id = tmp_path / "role-id"
    role_id.write_text(setup.role_ids["scheduler"])
    code, out = _persys("scheduler", "--store", f"sqlite:///{tmp_path / 's.db'}", "--listen", "127.0.0.1:0",
                        "--data-dir", str(tmp_path / "d"), "--identity-from", "openbao",
                        "--vault-addr", setup.server.url, "--vault-role-id-file", str(role_id),
                        "--vault-wrapped-secret-id-file", str(wrapped),
                        "--vault-approle-mount", setup.opts.approle_mount, "--vault-pki-mount", setup.opts.pki_mount,
                        "--runtime-dir", str(tmp_path / "run"))
    assert code == 1 and "already used or has expired" in out and "Traceback" not in out
    assert not (tmp_path / "run" / "scheduler.key").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["scheduler", "--store", "sqlite:///x.db", "--identity-from", "vault"],
     "--identity-from 'vault': use files or openbao"),
    (["scheduler", "--store", "sqlite:///x.db"], "--tls-dir is required with --identity-from files"),
    (["gateway", "--scheduler", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--identity-from", "openbao",
      "--vault-addr", "http://127.0.0.1:1"], "--vault-role-id-file (or $PERSYS_VAULT_ROLE_ID) is required"),
    (["certs", "vault-setup", "--vault-addr", "http://127.0.0.1:1", "--node-host", "*"], "--node-host '*' would match"),
    (["certs", "status"], "name a source: --store and/or --vault-addr"),
    (["certs", "issue", "--role", "user", "--name", "a", "--out", "never-written"],
     "--ca-dir (the built-in CA) or --vault-addr (OpenBao/Vault) is required"),
    (["certs", "issue", "--ca-dir", "ca", "--vault-addr", "http://127.0.0.1:1", "--role", "user", "--name", "a",
      "--out", "never-written"], "--ca-dir or --vault-addr: one signer, not both"),
    (["certs", "issue", "--vault-addr", "http://127.0.0.1:1", "--role", "user", "--name", "a", "--cert-ttl", "5",
      "--out", "never-written"], "--cert-ttl 5: from 60 seconds"),
    (["certs", "issue", "--vault-addr", "http://127.0.0.1:1", "--role", "user", "--name", "a", "--out",
      "never-written"], "OpenBao at http://127.0.0.1:1: ConnectionError"),
])
def test_bad_options_are_one_line_errors(args: list[str], message: str) -> None:
    code, out = _persys(*args, env={"VAULT_TOKEN": "x", "PERSYS_VAULT_ROLE_ID": "", "VAULT_ADDR": ""})
    assert code != 0 and message in out and "Traceback" not in out, out
    assert not Path("never-written").exists()


async def test_status_lists_registered_certificates(tmp_path: Path) -> None:
    from persys.scheduler.access.certificates import mark_revoked, record_issued
    from persys.security.signer import SignedCertificate
    from persys.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    await record_issued(store, SignedCertificate(b"", b"", "0a1b", soon), "node:n1", "builtin")
    await record_issued(store, SignedCertificate(b"", b"", "0c2d", soon), "node:n2", "builtin")
    await mark_revoked(store, "0c2d")
    await store.close()
    code, out = await asyncio.to_thread(_persys, "certs", "status", "--store", f"sqlite:///{tmp_path / 's.db'}")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:2] == ["IDENTITY", "STATE"]
    assert lines[1].split()[:2] == ["node:n1", "valid"] and lines[2].split()[:2] == ["node:n2", "revoked"]
    code, out = await asyncio.to_thread(_persys, "certs", "status", "--store", f"sqlite:///{tmp_path / 's.db'}",
                                        "--json")
    assert [r["serial"] for r in json.loads(out)] == ["0a1b", "0c2d"]


async def test_signer_from_options_records_every_signature(tmp_path: Path) -> None:
    from persys.cli.servers.errors import ServerError
    from persys.cli.servers.signer_options import signer_from_options
    from persys.scheduler.access.certificates import list_records
    from persys.security.pki import ClusterCA
    from persys.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        with pytest.raises(ServerError, match="no CA key"):
            signer_from_options(store, ca_dir=tmp_path / "nothing")
        ca = ClusterCA(tmp_path / "ca")
        ca.ensure()
        signer = signer_from_options(store, ca_dir=ca.dir)
        _, csr = new_key_and_csr("x")
        signed = await signer.sign(csr, identity_request("node", "n9", ("n9.example",), ()), TTL)
        assert [(r.serial, r.identity, r.signer) for r in await list_records(store)] == [
            (signed.serial, "node:n9", "builtin")]
    finally:
        await store.close()


# ---------------------------------------------------------------- a Vault-backed cluster's users

def test_an_operator_token_issues_an_admin_certificate_with_a_local_key(setup: Setup, tmp_path: Path) -> None:
    from persys.security.roles import Role, roles_of

    out = tmp_path / "alice"
    env = {"VAULT_TOKEN": setup.server.root_token, "VAULT_ADDR": ""}
    code, text = _persys("certs", "issue", "--vault-addr", setup.server.url, "--vault-pki-mount", setup.opts.pki_mount,
                         "--role", "user", "--name", "alice", "--group", "persys:admins", "--out", str(out), env=env)
    assert code == 0, text
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "user-alice.crt", "user-alice.key"]
    assert out.stat().st_mode & 0o777 == 0o700 and (out / "user-alice.key").stat().st_mode & 0o777 == 0o600
    cert = _cert((out / "user-alice.crt").read_bytes())
    identity = from_certificate(cert)
    assert (identity.principal, identity.groups, roles_of(identity)) == ("user:alice", ("persys:admins",),
                                                                          (Role.ADMIN,))
    key = serialization.load_pem_private_key((out / "user-alice.key").read_bytes(), None)
    assert cert.public_key() == key.public_key()
    assert _cert((out / "ca.crt").read_bytes()).subject == cert.issuer

    # Several groups, or one Persys does not bind: one line, nothing written.
    for groups in (["persys:admins", "persys:viewers"], ["ops"]):
        bad = tmp_path / "bad"
        code, text = _persys("certs", "issue", "--vault-addr", setup.server.url, "--vault-pki-mount",
                             setup.opts.pki_mount, "--role", "user", "--name", "bob",
                             *[a for g in groups for a in ("--group", g)], "--out", str(bad), env=env)
        assert code == 1 and "group" in text and "Traceback" not in text and not bad.exists(), text


async def test_no_service_approle_may_sign_a_user_into_a_group(setup: Setup, tmp_path: Path) -> None:
    _, csr = new_key_and_csr("x")
    admin = identity_request("user", "mallory", (), ("persys:admins",))
    for service in ("scheduler", "gateway"):
        with pytest.raises(CertificateRequestError, match="policy does not allow"):
            await BaoSigner(setup.login(service, tmp_path), setup.opts.pki_mount).sign(csr, admin, TTL)
