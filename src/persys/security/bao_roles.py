"""What Persys asks of a Vault/OpenBao PKI mount (pure: identities and options in, API bodies out).

One PKI role per Persys role, each allowing exactly its own common names and role name
(`peer_names`) plus the host names the operator lists; the subject is never taken from the CSR
(`use_csr_common_name`/`use_csr_sans` off), so only the key travels from the requester. A PKI role
fixes the subject's O, so each user group Persys binds (`roles.DEFAULT_BINDINGS`) has its own user
role with that group as O (`GROUP_PKI_ROLE`); no service's policy may sign with them. Two AppRoles,
each with a least-privilege policy: the scheduler's may sign scheduler and node certificates (it
admits nodes), the gateway's only gateway certificates.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from dataclasses import dataclass

from persys.security import peer_names
from persys.security.cert_requests import IdentityRequest
from persys.security.identity import Kind
from persys.security.pki import CertificateRequestError, certificate_contents
from persys.security.roles import DEFAULT_BINDINGS

PKI_MOUNT = "persys-pki"
APPROLE_MOUNT = "approle"
PKI_ROLE = {Kind.SCHEDULER: "persys-scheduler", Kind.GATEWAY: "persys-gateway", Kind.NODE: "persys-node",
            Kind.USER: "persys-user"}
# One user role per bound group (`persys:admins` -> `persys-user-admins`): the group is the role's fixed O.
GROUP_PKI_ROLE = {group: f"persys-user-{group.split(':', 1)[-1]}" for group in DEFAULT_BINDINGS}
# The AppRoles Persys' own services log in with, and the PKI roles each may sign for.
SERVICE_SIGNS = {"scheduler": (Kind.SCHEDULER, Kind.NODE), "gateway": (Kind.GATEWAY,)}
MAX_TTL = "720h"
_MOUNT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
# Names a host pattern must never match: another role's common name or role name.
_RESERVED_PROBES = ("scheduler", "gateway", "node:a", "user:a", "admin", peer_names.SCHEDULER, peer_names.GATEWAY,
                    peer_names.node("a"), peer_names.ROLE_DOMAIN)


class SetupError(ValueError):
    """An option `persys certs vault-setup` cannot apply; the message names it."""


def check_mount(path: str, option: str) -> str:
    if not _MOUNT.fullmatch(path):
        raise SetupError(f"{option} {path[:64]!r}: lower-case letters, digits, - and _, at most 63 characters")
    return path


def check_host_patterns(patterns: tuple[str, ...], option: str) -> tuple[str, ...]:
    """Host names (globs allowed, e.g. `*.nodes.example.com`) a role may put in certificates; a
    pattern that would let one role's certificate carry another role's name is refused."""
    for p in patterns:
        if not p or len(p) > 253 or any(c.isspace() or c == "," for c in p):
            raise SetupError(f"{option} {p[:64]!r}: a host name or glob, without spaces or commas")
        probe = next((r for r in _RESERVED_PROBES if fnmatch.fnmatchcase(r, p.lower())), None)
        if probe is not None or peer_names.is_reserved(p.replace("*", "x")):
            raise SetupError(f"{option} {p!r} would match {probe or p!r}: names under {peer_names.ROLE_DOMAIN} "
                             "and the roles' common names are given by role only")
    return patterns


def _own_names(kind: Kind) -> list[str]:
    if kind is Kind.SCHEDULER:
        return ["scheduler", "scheduler:*", peer_names.SCHEDULER]
    if kind is Kind.GATEWAY:
        return ["gateway", "gateway:*", peer_names.GATEWAY]
    if kind is Kind.NODE:
        return ["node:*", f"*.node.{peer_names.ROLE_DOMAIN}"]
    return ["user:*"]


def pki_role(kind: Kind, hosts: tuple[str, ...], max_ttl: str = MAX_TTL) -> dict[str, object]:
    """The body of `<mount>/roles/<PKI_ROLE[kind]>`: the role's own names plus `hosts`."""
    serves = kind is not Kind.USER  # a user certificate only ever dials
    return {
        "allowed_domains": [*_own_names(kind), *(hosts if serves else ())],
        "allow_bare_domains": True, "allow_glob_domains": True, "allow_subdomains": False,
        "allow_localhost": serves and "localhost" in hosts, "allow_ip_sans": serves,
        "enforce_hostnames": False,  # `node:a` is no host name; the allowed names above still bind
        "use_csr_common_name": False, "use_csr_sans": False,  # the admission names the identity, not the CSR
        "server_flag": serves, "client_flag": True, "key_type": "any",
        "require_cn": True, "organization": [], "max_ttl": max_ttl, "no_store": False,
    }


def group_role(group: str, max_ttl: str = MAX_TTL) -> dict[str, object]:
    """The body of `<mount>/roles/<GROUP_PKI_ROLE[group]>`: a user role whose certificates carry
    `group` as their only O (OpenBao writes the role's `organization`, never the CSR's)."""
    return {**pki_role(Kind.USER, (), max_ttl), "organization": [group]}


def role_for(kind: Kind, groups: tuple[str, ...]) -> str:
    """The PKI role that signs a `kind` certificate with `groups`: a user's one bound group picks
    that group's role; several groups, a group Persys does not bind, or groups on a machine's
    certificate are refused (a PKI role writes exactly one fixed O)."""
    wanted = tuple(dict.fromkeys(groups))
    if not wanted:
        return PKI_ROLE[kind]
    if kind is not Kind.USER:
        raise CertificateRequestError("groups: only user certificates carry groups")
    bound = ", ".join(GROUP_PKI_ROLE)
    if len(wanted) > 1:
        raise CertificateRequestError(f"groups {', '.join(wanted)[:200]}: a certificate from OpenBao carries one "
                                      f"group (its PKI role fixes the O); ask for one of {bound}")
    if wanted[0] not in GROUP_PKI_ROLE:
        raise CertificateRequestError(f"group {wanted[0][:64]!r}: OpenBao signs only the groups Persys binds "
                                      f"({bound}); for others use the built-in CA or API tokens")
    return GROUP_PKI_ROLE[wanted[0]]


def policy(service: str, pki_mount: str) -> str:
    """The HCL policy of `service`'s AppRole: sign what it may, read the CA bundle, nothing else."""
    lines = [f'path "{pki_mount}/sign/{PKI_ROLE[k]}" {{ capabilities = ["update"] }}' for k in SERVICE_SIGNS[service]]
    lines += [f'path "{pki_mount}/issuers" {{ capabilities = ["list"] }}',
              f'path "{pki_mount}/issuer/+/json" {{ capabilities = ["read"] }}']
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class SignCall:
    role: str
    body: dict[str, object]


def sign_call(csr_pem: bytes, request: IdentityRequest, ttl_seconds: int) -> SignCall:
    """The `<mount>/sign/<role>` call for `request`: names from the request (as the built-in CA
    would write them), never from the CSR. A user's group is the O its group's PKI role fixes
    (`role_for`)."""
    identity, names = certificate_contents(request.common_name, request.groups, request.hosts)
    role = role_for(identity.kind, request.groups)
    ips, dns = [], []
    for n in names:
        try:
            ips.append(str(ipaddress.ip_address(n)))
        except ValueError:
            dns.append(n)
    body: dict[str, object] = {"csr": csr_pem.decode("ascii"), "common_name": request.common_name,
                               "alt_names": ",".join(dns), "ip_sans": ",".join(ips), "ttl": f"{ttl_seconds}s",
                               "exclude_cn_from_sans": True, "format": "pem"}
    return SignCall(role, body)
