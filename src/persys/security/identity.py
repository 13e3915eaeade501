"""Who a verified peer is: the identity carried in its certificate's subject.

The convention (Kubernetes' client-certificate one, with a kind prefix so a name can never be
mistaken for another kind):

- common name `node:<node id>`: an agent, for that node only;
- common name `scheduler` or `scheduler:<name>`: a scheduler replica;
- common name `gateway` or `gateway:<name>`: a REST gateway;
- common name `user:<name>` (or the legacy `admin`): a person or tool; the subject's
  organization (O) attributes are its groups, which role bindings refer to.

Anything else is `unknown` and holds no rights.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cryptography import x509
from cryptography.x509.oid import NameOID


class Kind(StrEnum):
    NODE = "node"
    SCHEDULER = "scheduler"
    GATEWAY = "gateway"
    USER = "user"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Identity:
    kind: Kind
    name: str
    groups: tuple[str, ...] = ()

    @property
    def principal(self) -> str:
        """`kind:name`, the form audit records and error messages print."""
        return f"{self.kind}:{self.name}"


ANONYMOUS = Identity(Kind.UNKNOWN, "anonymous")
_PREFIXED = {k.value: k for k in (Kind.NODE, Kind.SCHEDULER, Kind.GATEWAY, Kind.USER)}


def from_subject(common_name: str, organizations: tuple[str, ...] = ()) -> Identity:
    """The identity a certificate subject names (pure: no chain checks, those happen in TLS)."""
    if common_name == "admin":
        return Identity(Kind.USER, "admin", organizations or ("persys:admins",))
    if common_name in ("scheduler", "gateway"):
        return Identity(_PREFIXED[common_name], common_name, organizations)
    kind, sep, name = common_name.partition(":")
    if sep and name and kind in _PREFIXED:
        return Identity(_PREFIXED[kind], name, organizations)
    return Identity(Kind.UNKNOWN, common_name or "anonymous", ())


def from_certificate(cert: x509.Certificate) -> Identity:
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    orgs = tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    return from_subject(str(cn[0].value) if cn else "", orgs)
