"""A built-in certificate authority for clusters that do not bring their own (Vault in production).

Every control-plane hop is mutual TLS. A certificate's common name is the caller's identity:
`scheduler`, `gateway`, `admin`, or `node:<node id>` for agents.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from persys.tlsfiles import TLSFiles as TLSFiles  # moved to a leaf module; re-exported for older callers

CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=365)


def _write_private(path: Path, data: bytes) -> None:
    # Keys are written 0600 from the first byte: never world-readable, even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class ClusterCA:
    """A file-backed CA in `directory` (ca.crt, ca.key) that issues leaf certificates."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.ca_cert_path = self.dir / "ca.crt"
        self.ca_key_path = self.dir / "ca.key"

    def exists(self) -> bool:
        return self.ca_cert_path.exists() and self.ca_key_path.exists()

    def ensure(self, cluster_name: str = "persys") -> None:
        """Create the CA once; later calls reuse it so issued certificates stay valid."""
        if self.exists():
            return
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster_name} cluster CA")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        _write_private(self.ca_key_path, _key_pem(key))
        self.ca_cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, name: str, common_name: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
    ) -> TLSFiles:
        """Issue (or reuse) `<name>.crt`/`<name>.key` for `common_name`, valid for `hosts`.

        Leaves carry both serverAuth and clientAuth: every component is a client of another.
        """
        cert_path, key_path = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        files = TLSFiles(self.ca_cert_path, cert_path, key_path)
        if cert_path.exists() and key_path.exists() and _matches(cert_path, common_name, hosts):
            return files
        ca_key = serialization.load_pem_private_key(self.ca_key_path.read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(self.ca_cert_path.read_bytes())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + LEAF_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        _write_private(key_path, _key_pem(key))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return files


def _matches(cert_path: Path, common_name: str, hosts: tuple[str, ...]) -> bool:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not cn or cn[0].value != common_name:
        return False
    if cert.not_valid_after_utc < dt.datetime.now(dt.UTC) + dt.timedelta(days=1):
        return False
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    names = {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(
        san.get_values_for_type(x509.DNSName)
    )
    return set(hosts) <= names


def standard_identities(ca: ClusterCA, node_id: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
                        ) -> dict[str, TLSFiles]:
    """The certificates an all-in-one cluster needs."""
    return {
        "scheduler": ca.issue("scheduler", "scheduler", hosts),
        "gateway": ca.issue("gateway", "gateway", hosts),
        "admin": ca.issue("admin", "admin", hosts),
        "agent": ca.issue(f"node-{node_id}", f"node:{node_id}", hosts),
    }
