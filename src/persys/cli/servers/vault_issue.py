"""`persys certs issue --vault-addr`: one identity signed by the OpenBao/Vault PKI mount with an
operator's token, the key made here (only a CSR goes to OpenBao).

This is how a Vault-backed cluster gets its first admin: a user certificate whose group is fixed
by the group's PKI role (`bao_roles.role_for`), trusted by services that run with
`--identity-from openbao`. The folder gets what the built-in CA's `issue` writes: ca.crt (the
mount's issuers), `<stem>.crt` and `<stem>.key` (0600, folder 0700), nothing else.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from pathlib import Path

from cryptography import x509
from hvac import exceptions as hvac_errors

from persys.cli.servers.errors import ServerError
from persys.security.bao_signer import BaoSigner, SignerUnavailable
from persys.security.cert_requests import IdentityRequest
from persys.security.csr import new_key_and_csr
from persys.security.pki import CertificateRequestError, private_dir
from persys.security.vault_session import VaultSession
from persys.tlsfiles import TLSFiles

MIN_TTL = 60
MAX_TTL = 30 * 24 * 3600  # the PKI roles cap it too (vault-setup --max-ttl)


def check_ttl(seconds: int) -> dt.timedelta:
    if not MIN_TTL <= seconds <= MAX_TTL:
        raise ServerError(f"--cert-ttl {seconds}: from {MIN_TTL} seconds to {MAX_TTL} (30 days)")
    return dt.timedelta(seconds=seconds)


def _write(path: Path, data: bytes, mode: int) -> None:
    # Written beside and renamed: a reader never sees half a file; a key is 0600 from its first byte.
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


async def _sign(session: VaultSession, pki: str, spec: IdentityRequest, ttl: dt.timedelta
                ) -> tuple[bytes, bytes, bytes]:
    key_pem, csr = new_key_and_csr(spec.common_name)
    signed = await BaoSigner(session, pki).sign(csr, spec, ttl)
    return key_pem, signed.certificate_pem, signed.ca_bundle_pem


def issue_from_openbao(session: VaultSession, pki: str, spec: IdentityRequest, ttl: dt.timedelta, out: Path
                       ) -> tuple[TLSFiles, x509.Certificate]:
    """Sign `spec` for a new key and write the folder; nothing is written unless OpenBao signed."""
    try:
        key_pem, cert_pem, bundle = asyncio.run(_sign(session, pki, spec, ttl))
    except CertificateRequestError as e:
        raise ServerError(str(e).replace("this service's policy", "this token's policy")) from None
    except SignerUnavailable as e:
        raise ServerError(str(e)) from None
    except hvac_errors.VaultError as e:  # e.g. no such mount: the name only, never a body
        raise ServerError(f"OpenBao refused: {'; '.join(map(str, e.errors or [type(e).__name__]))[:300]}") from None
    files = TLSFiles(out / "ca.crt", out / f"{spec.file_stem}.crt", out / f"{spec.file_stem}.key")
    private_dir(out)
    _write(files.key, key_pem, 0o600)
    _write(files.cert, cert_pem, 0o644)
    _write(files.ca, bundle, 0o644)
    return files, x509.load_pem_x509_certificate(cert_pem)
