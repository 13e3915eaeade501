"""The built-in signer: the certificate says what the request says, whatever the CSR asks for."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from persys.security.cert_requests import identity_request
from persys.security.csr import new_key_and_csr
from persys.security.pki import CertificateRequestError, ClusterCA
from persys.security.signer import BuiltinSigner


@pytest.fixture
def signer(tmp_path: Path) -> BuiltinSigner:
    ca = ClusterCA(tmp_path / "ca")
    ca.ensure()
    return BuiltinSigner(ca)


async def test_signs_the_csr_key_for_the_requested_identity_only(signer: BuiltinSigner) -> None:
    key_pem, csr_pem = new_key_and_csr("scheduler")  # the CSR asks for a scheduler...
    request = identity_request("node", "n7", ("10.0.0.7",), ())  # ...the admission grants node n7
    signed = await signer.sign(csr_pem, request, dt.timedelta(hours=2))
    cert = x509.load_pem_x509_certificate(signed.certificate_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node:n7"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "n7.node.persys.internal" in san.get_values_for_type(x509.DNSName)
    assert "scheduler.persys.internal" not in san.get_values_for_type(x509.DNSName)
    key = serialization.load_pem_private_key(key_pem, None)
    assert cert.public_key() == key.public_key()
    lifetime = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(hours=1, minutes=59) < lifetime <= dt.timedelta(hours=2)
    assert signed.not_after == cert.not_valid_after_utc and signed.serial == format(cert.serial_number, "x")
    assert b"BEGIN CERTIFICATE" in signed.ca_bundle_pem


async def test_user_certificates_are_client_only(signer: BuiltinSigner) -> None:
    _key, csr_pem = new_key_and_csr("ann")
    signed = await signer.sign(csr_pem, identity_request("user", "ann", (), ("ops",)), dt.timedelta(hours=1))
    cert = x509.load_pem_x509_certificate(signed.certificate_pem)
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]


async def test_refuses_a_csr_not_signed_by_its_key_and_garbage(signer: BuiltinSigner) -> None:
    request = identity_request("node", "n1", ("127.0.0.1",), ())
    with pytest.raises(CertificateRequestError, match="csr"):
        await signer.sign(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                          request, dt.timedelta(hours=1))
    with pytest.raises(CertificateRequestError, match="at most"):
        await signer.sign(b"x" * 20000, request, dt.timedelta(hours=1))
    # A CSR whose signature was made by another key than the one it carries.
    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])).sign(key, hashes.SHA256())
    der = bytearray(csr.public_bytes(serialization.Encoding.DER))
    mine = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    theirs = other.public_key().public_bytes(serialization.Encoding.DER,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)
    forged = bytes(der).replace(mine, theirs)
    pem = b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(forged) + \
        b"-----END CERTIFICATE REQUEST-----\n"
    with pytest.raises(CertificateRequestError, match="signature"):
        await signer.sign(pem, request, dt.timedelta(hours=1))
