"""This node's certificate on disk: where it lives, whether it is usable, and replacing it.

The agent's TLS folder holds only the CA bundle, its own key (0600, in a 0700 folder) and its
certificate. A new key and certificate are written beside the old ones and renamed over them
(key first), so a reader sees the old pair or the new one, at worst for a moment a new key with
the old certificate (that one dial fails and is retried).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from persys.security.pki import private_dir
from persys.security.renewal import Validity
from persys.tlsfiles import TLSFiles


class IdentityError(ValueError):
    """A certificate the node cannot use (the message says why)."""


def node_files(directory: Path, node_id: str) -> TLSFiles:
    return TLSFiles(directory / "ca.crt", directory / f"node-{node_id}.crt", directory / f"node-{node_id}.key")


def validity(files: TLSFiles) -> Validity:
    """The certificate's lifetime, counted from when this node received it (the file's time):
    CAs backdate notBefore for clock skew, which would move the renewal too early."""
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    received = files.cert.stat().st_mtime
    return Validity(max(cert.not_valid_before_utc.timestamp(), min(received, cert.not_valid_after_utc.timestamp())),
                    cert.not_valid_after_utc.timestamp())


def usable(files: TLSFiles, now: float) -> bool:
    """A key, a certificate not yet expired and a CA bundle are there: no join needed."""
    if not (files.ca.exists() and files.cert.exists() and files.key.exists()):
        return False
    try:
        return validity(files).not_after > now
    except ValueError:
        return False


def check_issued(cert_pem: bytes, key_pem: bytes, node_id: str) -> x509.Certificate:
    """The signed certificate is for our key and our node (a scheduler cannot hand us another's)."""
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
        key = serialization.load_pem_private_key(key_pem, None)
    except ValueError as e:
        raise IdentityError("the scheduler answered with no readable certificate") from e
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(serialization.Encoding.DER, spki) != key.public_key().public_bytes(
            serialization.Encoding.DER, spki):
        raise IdentityError("the scheduler's certificate is not for this node's key")
    cn = [str(a.value) for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
    if cn != [f"node:{node_id}"]:
        raise IdentityError(f"the scheduler's certificate names {cn}, not node:{node_id}")
    if cert.not_valid_after_utc <= dt.datetime.now(dt.UTC):
        raise IdentityError("the scheduler's certificate has already expired")
    return cert


def _replace(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # also when a stale .new file existed with another mode
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(files: TLSFiles, key_pem: bytes, cert_pem: bytes, ca_bundle_pem: bytes | None = None) -> None:
    """Write this node's new key and certificate (and the CA bundle, when given)."""
    private_dir(files.key.parent)
    if ca_bundle_pem is not None:
        _replace(files.ca, ca_bundle_pem, 0o644)
    _replace(files.key, key_pem, 0o600)
    _replace(files.cert, cert_pem, 0o644)
