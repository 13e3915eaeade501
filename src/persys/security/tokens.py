"""Bearer API tokens: their format, their stored record and whether one is valid (pure).

A token reads `persys_<id>_<secret>`: the id finds the record, the secret (32 random bytes,
URL-safe base64) proves possession. The store keeps the id, the digest of the secret (HMAC-SHA256
under the cluster's pepper, kept in the secret store; a bare sha256 for records made before the
pepper) and the token's user, role, expiry and revocation; never the secret, which is shown once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import asdict, dataclass, replace
from typing import Any

from persys.security.identity import Identity, Kind
from persys.security.roles import ROLE_GROUP, Role

PREFIX = "persys_"
DEFAULT_TTL = 30 * 86400.0
MAX_TTL = 366 * 86400.0
_TOKEN = re.compile(r"^persys_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
NAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,62}$")


class TokenError(ValueError):
    """A token request that cannot be honoured; the message names the field."""


@dataclass(frozen=True, slots=True)
class TokenRecord:
    id: str
    name: str
    role: str
    sha256: str
    created_at: float
    expires_at: float
    created_by: str
    description: str = ""
    revoked_at: float = 0.0
    revoked_by: str = ""
    peppered: bool = False  # sha256 holds HMAC-SHA256(pepper, secret)

    def to_doc(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items()}

    def public(self, now: float) -> dict[str, Any]:
        """What listings show: the record without its hash, with its state."""
        doc = {k: v for k, v in asdict(self).items() if k != "sha256"}
        doc["state"] = state(self, now)
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> TokenRecord:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})

    def identity(self) -> Identity:
        return Identity(Kind.USER, self.name, (ROLE_GROUP[Role(self.role)],))

    def revoked(self, by: str, now: float) -> TokenRecord:
        return replace(self, revoked_at=now, revoked_by=by)


def _digest(secret: str, pepper: bytes | None = None) -> str:
    if pepper is not None:
        return hmac.new(pepper, secret.encode(), hashlib.sha256).hexdigest()
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token(name: str, role: str, ttl: float, created_by: str, now: float, description: str = "",
              pepper: bytes | None = None) -> tuple[str, TokenRecord]:
    """A fresh token (the secret string) and the record to store. Raises TokenError naming the field."""
    if not NAME.match(name):
        raise TokenError("name: lowercase letters, digits and . _ @ - (1 to 63 characters)")
    if role not in {r.value for r in Role}:
        raise TokenError(f"role: one of {', '.join(r.value for r in Role)}")
    ttl = ttl or DEFAULT_TTL
    if not 0 < ttl <= MAX_TTL:
        raise TokenError(f"ttl_seconds: more than 0 and at most {int(MAX_TTL)}")
    if len(description) > 256:
        raise TokenError("description: at most 256 characters")
    token_id = secrets.token_hex(8)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    record = TokenRecord(token_id, name, role, _digest(secret, pepper), now, now + ttl, created_by, description,
                         peppered=pepper is not None)
    return f"{PREFIX}{token_id}_{secret}", record


def parse(token: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token, else None."""
    m = _TOKEN.match(token)
    return (m.group(1), m.group(2)) if m else None


def state(record: TokenRecord, now: float) -> str:
    if record.revoked_at:
        return "revoked"
    return "expired" if now >= record.expires_at else "active"


def verify(record: TokenRecord | None, secret: str, now: float, pepper: bytes | None = None) -> str:
    """'' if the secret matches an active record, else why not (for the refusal message).
    A peppered record needs the pepper."""
    if record is None or (record.peppered and pepper is None):
        return "unknown token"
    if not hmac.compare_digest(record.sha256, _digest(secret, pepper if record.peppered else None)):
        return "unknown token"
    st = state(record, now)
    return "" if st == "active" else f"token {record.id} is {st}"
