"""A built-in certificate authority for clusters that do not bring their own (Vault in production).

Every control-plane hop is mutual TLS. A certificate's subject is the caller's identity (see
`persys.security.identity`); its role decides what else it holds:

- scheduler, gateway: serverAuth and clientAuth, the given host names plus the role's name
  (`scheduler.persys.internal`, `gateway.persys.internal`, see `peer_names`), which clients verify;
- node `<id>`: clientAuth, and serverAuth for the agent's own logs/image service only under
  `<id>.node.persys.internal` plus its host names, so it never passes as a scheduler or gateway;
- user: clientAuth only, no names to serve under; groups in the subject's O attributes.

Private keys are 0600 in 0700 folders, also when they existed before with looser modes.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes as CertificatePublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from persys.model.node_names import node_id_problem
from persys.security import peer_names
from persys.security.identity import Identity, Kind, from_subject
from persys.tlsfiles import TLSFiles as TLSFiles  # moved to a leaf module; re-exported for older callers

CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=365)
ADMIN_GROUPS = ("persys:admins",)  # the group authorization binds to the admin role


class CertificateRequestError(ValueError):
    """An identity or host name the CA refuses to put into a certificate."""


def private_dir(path: Path) -> None:
    """Create `path` 0700, or tighten it to 0700 if it exists (mkdir's mode is ignored then)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


def protect_key(path: Path) -> None:
    """A key file found on disk is made 0600 again (a copy or an old release may have loosened it)."""
    if path.exists() and (path.stat().st_mode & 0o777) != 0o600:
        os.chmod(path, 0o600)


def _write_private(path: Path, data: bytes) -> None:
    # Keys are written 0600 from the first byte: never world-readable, even briefly; O_CREAT's
    # mode does not apply to a file that exists, so an existing one is tightened before writing.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def certificate_contents(common_name: str, groups: tuple[str, ...], hosts: tuple[str, ...]
                         ) -> tuple[Identity, tuple[str, ...]]:
    """The identity a certificate for `common_name` stands for and the names it carries (the
    hosts plus the role's name); raises CertificateRequestError for what no CA may sign."""
    identity = from_subject(common_name, groups)
    if identity.kind is Kind.UNKNOWN:
        raise CertificateRequestError(
            f"common name {common_name!r}: use node:<id>, scheduler[:<name>], gateway[:<name>] or user:<name>")
    problem = node_id_problem(identity.name) if identity.kind is Kind.NODE else None
    if problem:  # the id becomes a DNS name in the certificate, and the scheduler refuses others
        raise CertificateRequestError(problem)
    reserved = [h for h in hosts if peer_names.is_reserved(h)]
    if reserved:
        raise CertificateRequestError(f"host {reserved[0]!r}: names under {peer_names.ROLE_DOMAIN} and wildcards "
                                      "are given by role only")
    role_name = peer_names.for_identity(identity)
    return identity, ((*hosts, role_name) if role_name else ())


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
            private_dir(self.dir)
            protect_key(self.ca_key_path)
            return
        private_dir(self.dir)
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
        self, name: str, common_name: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
        groups: tuple[str, ...] = (), out: Path | None = None,
    ) -> TLSFiles:
        """Issue (or reuse) `<name>.crt`/`<name>.key` for `common_name`, valid for `hosts`.

        The subject's role (see the module docstring) decides key usage and names; users get no
        host names. `out` (default: the CA's folder) receives the key, the certificate and a copy
        of ca.crt, never the CA key: the folder to hand to the machine that uses the identity.
        """
        identity, names = certificate_contents(common_name, groups, hosts)
        folder = Path(out) if out is not None else self.dir
        private_dir(folder)
        ca_path = folder / "ca.crt"
        if folder != self.dir:
            ca_path.write_bytes(self.ca_cert_path.read_bytes())
        cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
        files = TLSFiles(ca_path, cert_path, key_path)
        if cert_path.exists() and key_path.exists() and _matches(cert_path, common_name, names, groups):
            protect_key(key_path)
            return files
        cert, key = self._sign(common_name, groups, names, identity.kind)
        _write_private(key_path, _key_pem(key))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return files

    def _sign(self, common_name: str, groups: tuple[str, ...], names: tuple[str, ...], kind: Kind
              ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        return self.certify(key.public_key(), common_name, groups, names, kind, LEAF_VALIDITY), key

    def certify(self, public_key: CertificatePublicKey, common_name: str, groups: tuple[str, ...],
                names: tuple[str, ...], kind: Kind, validity: dt.timedelta) -> x509.Certificate:
        """A certificate for a key held elsewhere (a CSR's): the subject, names and usages come
        from the arguments, never from the request, so a CSR cannot ask for more."""
        ca_key = serialization.load_pem_private_key(self.ca_key_path.read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(self.ca_cert_path.read_bytes())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        subject += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        # Users only ever dial: a user certificate cannot serve TLS at all.
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if kind is Kind.USER else [
            ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(ca_cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=False, crl_sign=False, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(_general_names(names)), critical=False)
        return builder.sign(ca_key, hashes.SHA256())


def _general_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    return sans


def _matches(cert_path: Path, common_name: str, hosts: tuple[str, ...], groups: tuple[str, ...]) -> bool:
    """Reuse a certificate only if it says what a new one would (an older release's leaf, with both
    usages and no role name, is replaced)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not cn or cn[0].value != common_name:
        return False
    orgs = tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    if orgs != groups:
        return False
    if cert.not_valid_after_utc < dt.datetime.now(dt.UTC) + dt.timedelta(days=1):
        return False
    try:
        cert.extensions.get_extension_for_class(x509.KeyUsage)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return not hosts and _client_only(cert)
    names = {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(
        san.get_values_for_type(x509.DNSName)
    )
    return set(hosts) <= names


def _client_only(cert: x509.Certificate) -> bool:
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def standard_identities(ca: ClusterCA, node_id: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
                        ) -> dict[str, TLSFiles]:
    """The certificates an all-in-one cluster needs."""
    return {
        "scheduler": ca.issue("scheduler", "scheduler", hosts),
        "gateway": ca.issue("gateway", "gateway", hosts),
        "admin": ca.issue("admin", "admin", hosts, groups=ADMIN_GROUPS),
        "agent": ca.issue(f"node-{node_id}", f"node:{node_id}", hosts),
    }
