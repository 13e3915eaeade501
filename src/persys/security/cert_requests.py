"""What `persys certs issue` puts into one certificate, from the role asked for (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from persys.model.node_names import node_id_problem

ROLES = ("node", "scheduler", "gateway", "user")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9._@]{0,62})?")


class IdentityRequestError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class IdentityRequest:
    common_name: str
    file_stem: str  # <stem>.crt / <stem>.key: the names the servers' --tls-dir expects
    hosts: tuple[str, ...]
    groups: tuple[str, ...]


def identity_request(role: str, name: str, hosts: tuple[str, ...], groups: tuple[str, ...]) -> IdentityRequest:
    """The certificate `role`/`name` gets; groups belong to users, host names to servers."""
    if role not in ROLES:
        raise IdentityRequestError(f"--role {role!r}: use one of {', '.join(ROLES)}")
    if groups and role != "user":
        raise IdentityRequestError("--group: only users have groups")
    if role == "user":
        if hosts:
            raise IdentityRequestError("--host: a user certificate is for clients only and serves under no name")
        _check_name(name, "--name (the user)")
        return IdentityRequest(f"user:{name}", f"user-{name}", (), groups)
    if not hosts:
        raise IdentityRequestError(f"--host: a {role} serves TLS: name the host names or addresses it is reached at")
    if role == "node":
        problem = node_id_problem(name)
        if problem:
            raise IdentityRequestError(f"--node-id: {problem}")
        return IdentityRequest(f"node:{name}", f"node-{name}", hosts, ())
    if name:
        _check_name(name, "--name")
    # One file name per role: `persys scheduler --tls-dir` reads scheduler.crt whatever the replica's name.
    return IdentityRequest(f"{role}:{name}" if name else role, role, hosts, ())


def _check_name(name: str, what: str) -> None:
    if not _NAME.fullmatch(name):
        raise IdentityRequestError(f"{what} {name[:64]!r}: letters, digits and -._@, at most 63 characters")
