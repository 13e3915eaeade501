"""The seam between a service that needs a certificate and the CA that signs it.

A service makes its own key and sends only a certificate signing request (`persys.security.csr`);
whoever admitted it (an AppRole login, a node join token, an operator) decides the identity, so a
signer takes the public key from the CSR and everything else from the `IdentityRequest`. The
built-in CA signs here; the Vault/OpenBao PKI engine is the other implementation.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from persys.security.cert_requests import IdentityRequest
from persys.security.pki import CertificateRequestError, ClusterCA, certificate_contents

MAX_CSR_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class SignedCertificate:
    certificate_pem: bytes  # the leaf, then any intermediates
    ca_bundle_pem: bytes  # every CA peers should trust now (two while a CA rotates)
    serial: str  # lower-case hex, as `persys certs status` and revocation name it
    not_after: dt.datetime


class CertificateSigner(Protocol):
    async def sign(self, csr_pem: bytes, request: IdentityRequest, ttl: dt.timedelta) -> SignedCertificate:
        """Sign the CSR's key for `request` (names, groups and usages from the request, never
        from the CSR); raises CertificateRequestError for a bad CSR or identity."""
        ...

    async def ca_bundle(self) -> bytes:
        """The CA certificates peers should trust now, PEM."""
        ...


def csr_public_key(csr_pem: bytes) -> x509.CertificateSigningRequest:
    """The parsed CSR, checked: bounded size, well-formed, signed by the key it carries
    (proof that the requester holds the private key)."""
    if len(csr_pem) > MAX_CSR_BYTES:
        raise CertificateRequestError(f"csr: {len(csr_pem)} bytes, at most {MAX_CSR_BYTES}")
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as e:
        raise CertificateRequestError("csr: not a PEM certificate signing request") from e
    if not csr.is_signature_valid:
        raise CertificateRequestError("csr: its signature does not match its key")
    return csr


def serial_hex(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


class BuiltinSigner:
    """Signs with the file-backed ClusterCA (the key must be on this machine)."""

    def __init__(self, ca: ClusterCA) -> None:
        self._ca = ca

    async def sign(self, csr_pem: bytes, request: IdentityRequest, ttl: dt.timedelta) -> SignedCertificate:
        csr = csr_public_key(csr_pem)
        identity, names = certificate_contents(request.common_name, request.groups, request.hosts)
        cert = self._ca.certify(csr.public_key(), request.common_name, request.groups, names, identity.kind, ttl)
        return SignedCertificate(cert.public_bytes(serialization.Encoding.PEM), await self.ca_bundle(),
                                 serial_hex(cert), cert.not_valid_after_utc)

    async def ca_bundle(self) -> bytes:
        return self._ca.ca_cert_path.read_bytes()
