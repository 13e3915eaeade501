"""Client certificates for each role the tests play: `user:<name>` with the role's group as the
subject's organization (what `persys certs` issues for people), signed by the cluster CA."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from persys.security.pki import TLSFiles

ROLE_GROUPS = {"admin": "persys:admins", "operator": "persys:operators", "viewer": "persys:viewers"}


def issue_user(pki: Path, name: str, groups: tuple[str, ...]) -> TLSFiles:
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"user:{name}"),
                         *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = TLSFiles(pki / "ca.crt", pki / f"user-{name}.crt", pki / f"user-{name}.key")
    files.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    files.key.chmod(0o600)
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return files


def role_identities(pki: Path) -> dict[str, TLSFiles]:
    """admin, operator, viewer (user certificates in the role's group), nobody (a user in no
    group) and node (the agent certificate `persys certs init --node n1` wrote)."""
    ids = {role: issue_user(pki, role, (group,)) for role, group in ROLE_GROUPS.items()}
    ids["nobody"] = issue_user(pki, "nobody", ())
    ids["node"] = TLSFiles(pki / "ca.crt", pki / "node-n1.crt", pki / "node-n1.key")
    return ids
