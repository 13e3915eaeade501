"""`CertificateSigner` on the Vault/OpenBao PKI secrets engine (`<mount>/sign/<role>`).

The identity comes from the `IdentityRequest` exactly as the built-in CA writes it (common name,
the role name of `peer_names` and the hosts as SANs; `bao_roles.sign_call`), so
`identity.from_subject` reads the same identity from either CA. The trust bundle is every issuer
of the mount: during a CA rotation that is the old and the new one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hvac import exceptions as hvac_errors

from persys.security.bao_roles import PKI_MOUNT, sign_call
from persys.security.cert_requests import IdentityRequest
from persys.security.pki import CertificateRequestError
from persys.security.signer import SignedCertificate, csr_public_key, serial_hex
from persys.security.vault_session import VaultSession

MAX_ISSUERS = 16  # a bundle is a handful of CAs (two during a rotation)


class SignerUnavailable(Exception):
    """OpenBao did not answer (down, sealed, paused): retry later; the current certificate holds."""


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def issuer_bundle(client: Any, mount: str) -> bytes:
    """Every issuer certificate of `mount`, PEM, in a stable order (blocking)."""
    listed = client.list(f"{mount}/issuers") or {}
    ids = sorted((listed.get("data") or {}).get("keys") or [])[:MAX_ISSUERS]
    pems = []
    for issuer_id in ids:
        data = client.read(f"{mount}/issuer/{issuer_id}/json")["data"]
        pems.append(_pem(x509.load_pem_x509_certificate(data["certificate"].encode())))
    return b"".join(pems)


class BaoSigner:
    """Signs CSRs through a logged-in `VaultSession` (a scheduler's AppRole may sign scheduler and
    node certificates, a gateway's only its own: the mount's policies enforce it)."""

    def __init__(self, session: VaultSession, mount: str = PKI_MOUNT) -> None:
        self._session = session
        self._mount = mount

    async def sign(self, csr_pem: bytes, request: IdentityRequest, ttl: dt.timedelta) -> SignedCertificate:
        csr_public_key(csr_pem)  # bounded, well-formed, proof of possession: before OpenBao sees it
        call = sign_call(csr_pem, request, max(1, int(ttl.total_seconds())))
        answer = await self._blocking(lambda c: c.write(f"{self._mount}/sign/{call.role}", **call.body))
        data = answer["data"]
        cert = x509.load_pem_x509_certificate(data["certificate"].encode())
        # Intermediates only (a root is in the bundle, never sent in the chain).
        chain = [x509.load_pem_x509_certificate(p.encode()) for p in data.get("ca_chain") or []]
        intermediates = b"".join(_pem(c) for c in chain if c.issuer != c.subject)
        bundle = await self.ca_bundle()
        return SignedCertificate(_pem(cert) + intermediates, bundle, serial_hex(cert), cert.not_valid_after_utc)

    async def ca_bundle(self) -> bytes:
        bundle: bytes = await self._blocking(lambda c: issuer_bundle(c, self._mount))
        return bundle

    async def _blocking(self, fn: Any) -> Any:
        try:
            return await asyncio.to_thread(self._session.call, fn)
        except hvac_errors.Forbidden:  # logged in afresh and still refused: the policy says no
            raise CertificateRequestError("OpenBao: this service's policy does not allow that certificate") from None
        except hvac_errors.InvalidRequest as e:  # the role refused a name: the request's fault
            raise CertificateRequestError(f"OpenBao refused the certificate: {'; '.join(map(str, e.errors))[:300]}"
                                          ) from None
        except (hvac_errors.VaultDown, hvac_errors.InternalServerError, hvac_errors.BadGateway, OSError) as e:
            # requests' connection errors and timeouts are OSErrors; the name only, never a body.
            raise SignerUnavailable(f"OpenBao at {self._session.url}: {type(e).__name__}") from None
