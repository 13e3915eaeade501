"""Where a scheduler or gateway gets its certificate: files (`--tls-dir`) or OpenBao/Vault (AppRole).

With `--identity-from openbao` nothing long-lived is on disk but the CA bundle: the service logs
in with its AppRole (role id from a file or $PERSYS_VAULT_ROLE_ID, the secret id response-wrapped
in a file that is unwrapped once and shredded), makes its key, has its certificate signed
(`BaoSigner`) and renews it in the background (`LiveIdentity`), keeping the current key in a 0600
file of its own under --runtime-dir. The options are shared by `persys scheduler` and `persys gateway`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import typer

from persys.cli.servers.errors import ServerError
from persys.scheduler.access.certificates import record_issued
from persys.security.bao_roles import APPROLE_MOUNT, PKI_MOUNT
from persys.security.bao_signer import BaoSigner, SignerUnavailable
from persys.security.cert_requests import IdentityRequestError, identity_request
from persys.security.live_identity import MIN_TTL, LiveIdentity, Material
from persys.security.pki import CertificateRequestError
from persys.security.signer import SignedCertificate
from persys.security.vault_session import (
    REQUEST_TIMEOUT,
    VaultLoginError,
    VaultSession,
    read_credential,
    unwrap_secret_id,
)
from persys.store.base import StateStore

log = logging.getLogger(__name__)
SOURCES = ("files", "openbao")
ROLE_ID_ENV = "PERSYS_VAULT_ROLE_ID"
DEFAULT_TTL = 8 * 3600

IDENTITY_FROM = typer.Option("files", "--identity-from", help="files: the certificate and key in --tls-dir. "
                             "openbao: log in to Vault/OpenBao with AppRole and obtain (and renew) a short-lived "
                             "certificate; only the CA bundle and the current key are on disk (--runtime-dir).")
VAULT_ADDR = typer.Option("", "--vault-addr", envvar="VAULT_ADDR", help="OpenBao/Vault URL, e.g. "
                          "https://bao.example:8200 (with --identity-from openbao).")
VAULT_CA_FILE = typer.Option(None, "--vault-ca-file", envvar="VAULT_CACERT",
                             help="CA certificate that verifies the OpenBao/Vault server (default: the system's).")
VAULT_ROLE_ID_FILE = typer.Option(None, "--vault-role-id-file", help="File holding this service's AppRole role id "
                                  f"(`persys certs vault-setup` prints it); or set ${ROLE_ID_ENV}.")
VAULT_SECRET_ID_FILE = typer.Option(None, "--vault-wrapped-secret-id-file", help="File holding a response-wrapped, "
                                    "single-use secret id (`persys certs vault-secret-id`); unwrapped once at "
                                    "start, then overwritten and deleted. A restart needs a new one.")
VAULT_PKI_MOUNT = typer.Option(PKI_MOUNT, "--vault-pki-mount", help="The PKI secrets engine's mount path.")
VAULT_APPROLE_MOUNT = typer.Option(APPROLE_MOUNT, "--vault-approle-mount", help="The AppRole auth mount path.")
CERT_TTL = typer.Option(DEFAULT_TTL, "--cert-ttl", min=int(MIN_TTL.total_seconds()),
                        help="Certificate lifetime in seconds (renewed at about two thirds of it; default 8 h).")
CERT_HOST = typer.Option([], "--cert-host", help="Host name or IP this service is reached at, written into its "
                         "certificate (repeatable; default localhost and 127.0.0.1; the PKI role must allow it).")
RUNTIME_DIR = typer.Option(None, "--runtime-dir", help="Private folder (0700) for the CA bundle and the current "
                           "key and certificate (default $RUNTIME_DIRECTORY or /run/persys/<service>).")


@dataclass(frozen=True, slots=True)
class VaultIdentityOptions:
    addr: str
    ca_file: Path | None
    role_id_file: Path | None
    secret_id_file: Path | None
    pki_mount: str = PKI_MOUNT
    approle_mount: str = APPROLE_MOUNT
    ttl_seconds: int = DEFAULT_TTL
    hosts: tuple[str, ...] = ()
    runtime_dir: Path | None = None


def check_source(source: str, tls_dir: Path | None) -> None:
    if source not in SOURCES:
        raise ServerError(f"--identity-from {source!r}: use {' or '.join(SOURCES)}")
    if source == "files" and tls_dir is None:
        raise ServerError("--tls-dir is required with --identity-from files")


def _role_id(o: VaultIdentityOptions) -> str:
    if o.role_id_file is not None:
        return read_credential(o.role_id_file, "--vault-role-id-file")
    env = os.environ.get(ROLE_ID_ENV, "").strip()
    if not env:
        raise VaultLoginError(f"--vault-role-id-file (or ${ROLE_ID_ENV}) is required with --identity-from openbao")
    return env


def _session(o: VaultIdentityOptions) -> VaultSession:
    if not o.addr:
        raise VaultLoginError("--vault-addr (or $VAULT_ADDR) is required with --identity-from openbao")
    role_id = _role_id(o)
    if o.secret_id_file is None:
        raise VaultLoginError("--vault-wrapped-secret-id-file is required with --identity-from openbao")
    secret_id = unwrap_secret_id(o.addr, o.ca_file, o.secret_id_file, "--vault-wrapped-secret-id-file")
    # A stalled OpenBao holds one attempt for at most a twentieth of the lifetime: retries stay frequent.
    timeout = min(REQUEST_TIMEOUT, o.ttl_seconds / 20)
    return VaultSession(o.addr, o.ca_file, approle=(role_id, secret_id), approle_mount=o.approle_mount,
                        timeout=timeout)


async def start_identity(o: VaultIdentityOptions, role: str, name: str = "") -> LiveIdentity:
    """Log in, obtain the first certificate and start renewing; a one-line ServerError otherwise."""
    try:
        request = identity_request(role, name, o.hosts or ("localhost", "127.0.0.1"), ())
        session = await asyncio.to_thread(_session, o)
        runtime = o.runtime_dir or Path(os.environ.get("RUNTIME_DIRECTORY") or f"/run/persys/{role}")
        identity = LiveIdentity(BaoSigner(session, o.pki_mount), request, dt.timedelta(seconds=o.ttl_seconds),
                                runtime)
        await identity.start()
    except (IdentityRequestError, VaultLoginError, CertificateRequestError, SignerUnavailable, ValueError) as e:
        raise ServerError(str(e)) from None
    except OSError as e:  # the runtime folder, or OpenBao unreachable at the very start
        if e.filename:
            raise ServerError(f"--runtime-dir: {e.filename}: {e.strerror}") from None
        raise ServerError(f"--vault-addr {o.addr}: OpenBao is unreachable ({type(e).__name__})") from None
    return identity


async def track_in_registry(store: StateStore, identity: LiveIdentity) -> None:
    """Record this service's certificate and each renewal in the registry `persys certs status` reads."""

    async def record(m: Material) -> None:
        signed = SignedCertificate(m.cert_pem, m.ca_pem, m.serial,
                                   dt.datetime.fromtimestamp(m.validity.not_after, dt.UTC))
        try:
            await record_issued(store, signed, identity.principal, "openbao")
        except Exception as e:  # the store down: the certificate serves all the same
            log.warning("could not record certificate %s in the registry: %s", m.serial, e)

    identity.on_change(record)
    await record(identity.current)
