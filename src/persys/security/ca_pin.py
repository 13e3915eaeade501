"""Pinning the cluster CA before trusting it (pure): kubeadm's discovery hash.

A join token travels with `sha256:<hex>`, the sha256 of the CA certificate's
SubjectPublicKeyInfo (DER). A joining node fetches the scheduler's certificate chain without
verifying it, finds the CA certificate whose key matches the pin, checks that the scheduler's
certificate was issued by it, and only then trusts it for anything (sending the token included).
"""

from __future__ import annotations

import hashlib
import re

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

PREFIX = "sha256:"
_PIN = re.compile(r"^sha256:[0-9a-f]{64}$")


class PinError(ValueError):
    """A malformed pin, or a chain that does not match it; the message says which."""


def pin_of(cert: x509.Certificate) -> str:
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return PREFIX + hashlib.sha256(spki).hexdigest()


def pin_of_pem(pem: bytes) -> str:
    """The pin of the first certificate in a PEM bundle (the current CA)."""
    return pin_of(x509.load_pem_x509_certificates(pem)[0])


def check_pin(text: str) -> str:
    """The pin in canonical form, or PinError naming the flag."""
    pin = text.strip().lower()
    if not _PIN.match(pin):
        raise PinError("--ca-pin: expected sha256:<64 hex digits> (printed by `persysctl node token create`)")
    return pin


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def pinned_ca(chain_der: list[bytes], pin: str) -> x509.Certificate:
    """The CA certificate of a server's unverified chain (leaf first) that matches `pin` and
    issued the leaf; PinError otherwise (wrong CA, no CA in the chain, a leaf it did not sign)."""
    if not chain_der:
        raise PinError("the server presented no certificate")
    try:
        certs = [x509.load_der_x509_certificate(d) for d in chain_der[:8]]
    except ValueError as e:
        raise PinError("the server presented a certificate that does not parse") from e
    leaf = certs[0]
    for ca in certs[1:]:
        if not _is_ca(ca) or pin_of(ca) != pin:
            continue
        try:
            leaf.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            raise PinError("the server's certificate was not issued by the pinned CA") from None
        return ca
    seen = ", ".join(pin_of(c) for c in certs[1:] if _is_ca(c)) or "none"
    raise PinError(f"no CA in the server's chain matches the pin {pin} (the chain's CAs: {seen})")
