"""How Persys reaches its etcd and Redis servers as they are run in production: a leaf module.

etcd and Redis usually have their own PKI (a CA that is not Persys' cluster CA, a client
certificate issued by it) and their own users (an etcd user whose role is limited to the
Persys key prefix; a Redis ACL user limited to the Persys key pattern). `BackendOptions` is
what the command line says about one backend; `access_problems` (pure) checks it and
`backend_access` turns it into a `BackendAccess`: TLS file paths plus a user and a
credential reference, resolved to a password only when the process starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from persys.credentials import (
    CredentialError,
    CredentialRef,
    Login,
    SecretResolver,
    parse_ref,
    read_local,
    resolve,
    url_password_problem,
)
from persys.tlsfiles import TLSFiles

Kind = Literal["etcd", "redis"]
_TLS_SCHEMES = {"etcd": "etcds", "redis": "rediss"}
_URL_OPTION = {"etcd": "--store", "redis": "--events"}
MAX_USER_CHARS = 128


@dataclass(frozen=True, slots=True)
class BackendTLS:
    """TLS toward a backend: the CA that verifies the server (None: the system's trust store) and,
    when the server requires client certificates, our certificate and key."""

    ca: Path | None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None  # name to verify when the address is not in the certificate

    @classmethod
    def from_files(cls, tls: TLSFiles) -> BackendTLS:
        """Persys' own identity used toward the backend (a backend trusting the cluster CA)."""
        return cls(tls.ca, tls.cert, tls.key, tls.server_name)


@dataclass(frozen=True, slots=True)
class BackendAccess:
    kind: Kind
    tls: BackendTLS | None = None
    user: str | None = None
    password: CredentialRef | None = None

    @property
    def password_option(self) -> str:
        return f"--{self.kind}-password"

    async def login(self, secrets: SecretResolver | None = None) -> Login | None:
        """The user and its resolved password, or None when the backend takes no password."""
        if self.password is None:
            return None
        ref, option = self.password, self.password_option
        password = await resolve(ref, option, secrets)
        reread = (lambda: read_local(ref, option)) if ref.scheme in ("file", "env") else None
        return Login(self.user or "default", password, reread)


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """One backend's options as given on the command line (paths and references, never values)."""

    kind: Kind
    url: str
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None
    user: str | None = None
    password: str | None = None  # a reference: file:PATH, env:NAME, secret:NAME/KEY
    password_file: Path | None = None


def _url_problems(o: BackendOptions) -> list[str]:
    out = []
    problem = url_password_problem(o.url, _URL_OPTION[o.kind], f"--{o.kind}-password")
    if problem:
        out.append(problem)
    try:
        url_user = urlsplit(o.url).username
    except ValueError:
        url_user = None
    if url_user and o.kind == "etcd":
        out.append(f"--store: etcd URLs carry no user; pass it with --etcd-user {url_user}")
    if url_user and o.user and url_user != o.user:
        out.append(f"--redis-user: {o.user!r} differs from the user in --events ({url_user!r}); give one")
    return out


def _tls_problems(o: BackendOptions) -> list[str]:
    p, tls_scheme = f"--{o.kind}", _TLS_SCHEMES[o.kind]
    out = []
    given = [name for name, v in (("ca", o.ca), ("cert", o.cert), ("key", o.key), ("server-name", o.server_name))
             if v is not None]
    if given and o.url.partition("://")[0] != tls_scheme:
        out.append(f"{p}-{given[0]}: TLS options need a {tls_scheme}:// URL in {_URL_OPTION[o.kind]}")
    if (o.cert is None) != (o.key is None):
        out.append(f"{p}-cert and {p}-key: give both (the client certificate and its key) or neither")
    for name, path in (("ca", o.ca), ("cert", o.cert), ("key", o.key)):
        if path is not None and not path.is_file():
            out.append(f"{p}-{name}: {path}: no such file")
    return out


def _login_problems(o: BackendOptions, user: str | None) -> list[str]:
    p = f"--{o.kind}"
    out = []
    if o.password is not None and o.password_file is not None:
        out.append(f"{p}-password and {p}-password-file: give one")
    if o.password is not None:
        try:
            parse_ref(o.password, f"{p}-password")
        except CredentialError as e:
            out.append(str(e))
    has_password = o.password is not None or o.password_file is not None
    if user is not None and (not user or len(user) > MAX_USER_CHARS or not user.isprintable() or " " in user):
        out.append(f"{p}-user: a user name is 1 to {MAX_USER_CHARS} printable characters without spaces")
    if user and not has_password:
        out.append(f"{p}-user: needs {p}-password-file FILE or {p}-password file:PATH|env:NAME|secret:NAME/KEY")
    if has_password and not user and o.kind == "etcd":
        out.append(f"{p}-password: needs {p}-user (the etcd user it belongs to)")
    return out


_SCHEMES = {"etcd": ("etcd", "etcds"), "redis": ("redis", "rediss", "unix")}


def _given(o: BackendOptions) -> list[str]:
    values = {"ca": o.ca, "cert": o.cert, "key": o.key, "server-name": o.server_name, "user": o.user,
              "password": o.password, "password-file": o.password_file}
    return [f"--{o.kind}-{name}" for name, v in values.items() if v is not None]


CLUSTER_CA_CLIENTS = (
    "every certificate the cluster CA issued (a node's, a viewer's) would be a full etcd client: give etcd a CA "
    "of its own (--etcd-ca, --etcd-cert, --etcd-key) or turn etcd authentication on (--etcd-user with "
    "--etcd-password-file); docs/security.md, \"etcd and Redis in production\"")


def _cluster_ca_problems(o: BackendOptions, user: str | None) -> list[str]:
    """`etcds://` with no CA of etcd's own falls back to Persys' certificate folder: etcd then
    trusts the cluster CA, and without etcd authentication any certificate of the cluster may read
    and write every key. Refused unless etcd authentication is on."""
    if o.kind != "etcd" or o.url.partition("://")[0] != "etcds" or o.ca is not None or o.cert is not None:
        return []
    if user and (o.password is not None or o.password_file is not None):
        return []
    return [f"--etcd-ca: etcds:// without --etcd-ca means an etcd that trusts the cluster CA; {CLUSTER_CA_CLIENTS}"]


def same_ca_problem(o: BackendOptions, cluster_ca: Path) -> str | None:
    """--etcd-ca naming the cluster CA itself (its bytes), without etcd authentication: the same
    hole as no --etcd-ca at all."""
    if o.kind != "etcd" or o.ca is None or o.user:
        return None
    try:
        given = o.ca.read_bytes().strip()
        same = bool(given) and given == cluster_ca.read_bytes().strip()
    except OSError:  # a missing --etcd-ca is reported by _tls_problems
        return None
    return f"--etcd-ca: {o.ca} is the cluster CA; {CLUSTER_CA_CLIENTS}" if same else None


def access_problems(o: BackendOptions) -> list[str]:
    """Everything wrong with one backend's options, each naming its option (pure but for file checks)."""
    given = _given(o)
    if given and o.url.partition("://")[0] not in _SCHEMES[o.kind]:
        schemes = " or ".join(f"{s}://" for s in _SCHEMES[o.kind])
        return [f"{given[0]}: only for {schemes} in {_URL_OPTION[o.kind]}"]
    user = o.user
    if user is None and o.kind == "redis":
        try:
            user = urlsplit(o.url).username
        except ValueError:
            user = None
    return [*_url_problems(o), *_tls_problems(o), *_login_problems(o, user), *_cluster_ca_problems(o, user)]


def backend_access(o: BackendOptions, default_tls: TLSFiles | None = None) -> BackendAccess:
    """The access these options describe; raises CredentialError listing every problem.

    An `etcds://` store without --etcd-ca uses `default_tls` (Persys' own certificate folder), as
    before these options existed, only with etcd authentication on (etcd trusts the cluster CA
    then: without it, any cluster certificate would be a full etcd client); `rediss://` without
    --redis-ca trusts the system's CAs."""
    problems = access_problems(o)
    same = same_ca_problem(o, default_tls.ca) if default_tls is not None else None
    if same:
        problems.append(same)
    if problems:
        raise CredentialError("; ".join(problems))
    tls: BackendTLS | None = None
    if o.url.partition("://")[0] == _TLS_SCHEMES[o.kind]:
        if o.ca is None and o.cert is None and o.kind == "etcd" and default_tls is not None:
            tls = BackendTLS.from_files(default_tls)
        else:
            tls = BackendTLS(o.ca, o.cert, o.key, o.server_name)
    ref = (CredentialRef("file", str(o.password_file)) if o.password_file is not None
           else parse_ref(o.password, f"--{o.kind}-password") if o.password is not None else None)
    user = o.user or (urlsplit(o.url).username if o.kind == "redis" else None)
    return BackendAccess(o.kind, tls, user, ref)


# How TLS handshakes that will not succeed on retry show in gRPC's and Python's ssl messages.
_SERVER_NOT_TRUSTED = ("certificate_verify_failed", "certificate verify failed", "hostname mismatch")
_CLIENT_REFUSED = ("tsi_data_corrupted", "unwrap failed", "bad certificate", "bad_certificate",
                   "certificate_required", "certificate required", "unknown ca", "unknown_ca")


def tls_refusal_hint(message: str, kind: Kind) -> str | None:
    """What a refused TLS handshake means and which option to check, or None for anything else
    (an unreachable server is an outage to wait out, a refused handshake a configuration error)."""
    low, p = message.lower(), f"--{kind}"
    if any(s in low for s in _SERVER_NOT_TRUSTED):
        return f"the {kind} server's certificate is not trusted: {p}-ca must name the CA that issued it"
    if any(s in low for s in _CLIENT_REFUSED):
        return (f"the {kind} server refused our client certificate: {p}-cert/{p}-key must be issued by a CA "
                f"the server trusts (and the server may require one)")
    if "handshake" in low or "ssl" in low or "wrong version number" in low:
        return f"the TLS handshake with the {kind} server failed: check {p}-ca, {p}-cert and {p}-key"
    return None
