"""Node join tokens: their format, their stored record and whether one admits a node (pure).

A token reads `<id>.<secret>` (kubeadm's shape): the id (6 characters) finds the record, the
secret (32 characters, about 165 random bits) proves possession. The store keeps the id, the
sha256 of the secret, the expiry, the node it is for (if it names one) and its use: never the
secret, which is shown once. A token admits one node, once, before its expiry.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
from dataclasses import asdict, dataclass, replace
from typing import Any

from persys.model.node_names import node_id_problem

DEFAULT_TTL = 3600.0
MIN_TTL = 60.0
MAX_TTL = 7 * 86400.0
MAX_DESCRIPTION = 256
_ALPHABET = string.ascii_lowercase + string.digits
_TOKEN = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{32})$")
TOKEN_ID = re.compile(r"^[a-z0-9]{6}$")


class JoinTokenError(ValueError):
    """A token request that cannot be honoured; the message names the field."""


@dataclass(frozen=True, slots=True)
class JoinTokenRecord:
    id: str
    sha256: str
    created_at: float
    expires_at: float
    created_by: str
    node_id: str = ""  # the only node it admits; '' = the joining node names a new id
    description: str = ""
    used_at: float = 0.0
    used_by: str = ""  # the node it admitted
    revoked_at: float = 0.0
    revoked_by: str = ""

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> JoinTokenRecord:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})

    def public(self, now: float) -> dict[str, Any]:
        """What listings show: never the hash."""
        doc = {k: v for k, v in asdict(self).items() if k != "sha256"}
        doc["state"] = state(self, now)
        return doc

    def used(self, node_id: str, now: float) -> JoinTokenRecord:
        return replace(self, used_at=now, used_by=node_id)

    def revoked(self, by: str, now: float) -> JoinTokenRecord:
        return replace(self, revoked_at=now, revoked_by=by)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _random(n: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))


def new_join_token(ttl: float, node_id: str, created_by: str, now: float, description: str = ""
                   ) -> tuple[str, JoinTokenRecord]:
    """A fresh token (the secret string) and the record to store; JoinTokenError names the field."""
    ttl = ttl or DEFAULT_TTL
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise JoinTokenError(f"ttl_seconds: from {int(MIN_TTL)} (1 minute) to {int(MAX_TTL)} (7 days)")
    if node_id and (problem := node_id_problem(node_id)):
        raise JoinTokenError(f"node_id: {problem}")
    if len(description) > MAX_DESCRIPTION or not description.isprintable():
        raise JoinTokenError(f"description: printable text, at most {MAX_DESCRIPTION} characters")
    token_id, secret = _random(6), _random(32)
    return f"{token_id}.{secret}", JoinTokenRecord(token_id, digest(secret), now, now + ttl, created_by,
                                                  node_id, description)


def parse(token: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token, else None."""
    m = _TOKEN.match(token.strip()) if len(token) <= 128 else None
    return (m.group(1), m.group(2)) if m else None


def state(record: JoinTokenRecord, now: float) -> str:
    if record.revoked_at:
        return "revoked"
    if record.used_at:
        return "used"
    return "expired" if now >= record.expires_at else "active"


@dataclass(frozen=True, slots=True)
class Admission:
    node_id: str = ""  # the node admitted ('' when refused)
    refusal: str = ""  # why not, for the caller and the audit log ('' when admitted)
    forged: bool = False  # no such token, or a wrong secret
    named: bool = False  # the token names its node (so it may re-admit a node the cluster knows)


def admit(record: JoinTokenRecord | None, secret: str, requested_node: str, now: float) -> Admission:
    """Whether a token admits `requested_node` now. An unknown id and a wrong secret read the same
    (`unknown token`): a prober learns nothing about which ids exist."""
    if record is None or not hmac.compare_digest(record.sha256, digest(secret)):
        return Admission(refusal="unknown token", forged=True)
    st = state(record, now)
    if st != "active":
        return Admission(refusal=f"token {record.id} is {st}")
    node = requested_node or record.node_id
    if record.node_id and node != record.node_id:
        return Admission(refusal=f"node_id: token {record.id} admits node {record.node_id} only")
    if not node:
        return Admission(refusal=f"node_id: token {record.id} names no node: say which (--node-id)")
    if problem := node_id_problem(node):
        return Admission(refusal=f"node_id: {problem}")
    return Admission(node_id=node, named=bool(record.node_id))
