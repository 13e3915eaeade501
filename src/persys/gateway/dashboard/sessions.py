"""Dashboard sessions: a random id in a cookie (HttpOnly, Secure, SameSite=Strict), everything
else in this gateway's memory. The API token a user signed in with never goes back to the
browser; a restart of the gateway signs everyone out (sessions are not shared between gateways:
put a sticky load balancer in front of several, or sign in again)."""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

from persys.security.identity import Identity
from persys.security.roles import Role, decide, roles_of

COOKIE = "persys_session"
SESSION_SECONDS = 12 * 3600.0
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Session:
    sid: str
    csrf: str
    identity: Identity
    token: str | None  # None: signed in with the connection's client certificate
    credential: str
    expires: float
    roles: tuple[Role, ...] = field(default=())

    def can(self, verb: str, resource: str) -> bool:
        """Whether the gateway's role rules allow it (the scheduler checks again on the call)."""
        return decide(self.identity, verb, resource).allowed

    def csrf_ok(self, presented: str) -> bool:
        return hmac.compare_digest(self.csrf.encode(), presented.encode())


class SessionStore:
    def __init__(self, seconds: float = SESSION_SECONDS, limit: int = MAX_SESSIONS) -> None:
        self.seconds = seconds
        self.limit = limit
        self._by_id: dict[str, Session] = {}

    def new(self, identity: Identity, token: str | None, credential: str) -> Session:
        now = time.time()
        if len(self._by_id) >= self.limit:  # expired ones first, then the oldest
            self._by_id = {k: s for k, s in self._by_id.items() if s.expires > now}
            while len(self._by_id) >= self.limit:
                del self._by_id[next(iter(self._by_id))]
        s = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), identity, token, credential,
                    now + self.seconds, roles_of(identity))
        self._by_id[s.sid] = s
        return s

    def get(self, sid: str) -> Session | None:
        s = self._by_id.get(sid)
        if s is None:
            return None
        if s.expires <= time.time():
            del self._by_id[sid]
            return None
        return s

    def drop(self, sid: str) -> None:
        self._by_id.pop(sid, None)

    def drop_token(self, token: str) -> None:
        """Every session signed in with `token` (the scheduler refused it: revoked or expired)."""
        self._by_id = {k: s for k, s in self._by_id.items() if s.token != token}
