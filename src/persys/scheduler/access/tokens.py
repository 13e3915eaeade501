"""API tokens in the durable store, under their own prefix (outside /persys/: the state mirror
does not follow them, and backups neither carry nor restore them, so a restore can never bring
a revoked token back)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

from persys.security.identity import Identity
from persys.security.tokens import TokenError, TokenRecord, new_token, parse, verify
from persys.store.base import StateStore

TOKENS = "/persys-auth/tokens/"


class TokenRefusedError(Exception):
    """An unknown, malformed, expired or revoked token."""


class TokenStore:
    def __init__(self, store: StateStore, pepper: Callable[[], Awaitable[bytes]] | None = None) -> None:
        self.store = store
        self.pepper = pepper  # scheduler.token_pepper: new records are HMACs under it

    async def create(self, name: str, role: str, ttl: float, created_by: str, description: str = ""
                     ) -> tuple[str, TokenRecord]:
        pepper = await self.pepper() if self.pepper is not None else None
        secret, record = new_token(name, role, ttl, created_by, time.time(), description, pepper)
        if await self.store.cas(TOKENS + record.id, json.dumps(record.to_doc()).encode(), 0) is None:
            raise TokenError("id: collision, try again")  # 64 random bits: practically never
        return secret, record

    async def get(self, token_id: str) -> TokenRecord | None:
        kv = await self.store.get(TOKENS + token_id)
        return TokenRecord.from_doc(json.loads(kv.value)) if kv else None

    async def list(self) -> list[TokenRecord]:
        kvs, _ = await self.store.range(TOKENS)
        return [TokenRecord.from_doc(json.loads(kv.value)) for kv in kvs]

    async def revoke(self, token_id: str, by: str) -> TokenRecord | None:
        """The revoked record (None if there is no such token); revoking twice keeps the first."""
        while True:
            kv = await self.store.get(TOKENS + token_id)
            if kv is None:
                return None
            record = TokenRecord.from_doc(json.loads(kv.value))
            if record.revoked_at:
                return record
            done = record.revoked(by, time.time())
            if await self.store.cas(kv.key, json.dumps(done.to_doc()).encode(), kv.mod_revision) is not None:
                return done

    async def authenticate(self, token: str) -> tuple[Identity, str]:
        """The identity a bearer token acts as and the credential's name ('token <id>'). Read
        from the store each time: a revocation holds at once on every replica."""
        parts = parse(token)
        if parts is None:
            raise TokenRefusedError("malformed token")
        record = await self.get(parts[0])
        pepper = await self.pepper() if record is not None and record.peppered and self.pepper else None
        why = verify(record, parts[1], time.time(), pepper)
        if why or record is None:
            raise TokenRefusedError(why or "unknown token")
        return record.identity(), f"token {record.id}"
