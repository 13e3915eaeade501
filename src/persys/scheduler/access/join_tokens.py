"""Node join tokens in the durable store, under their own prefix (outside /persys/: the state
mirror does not follow them, and backups neither carry nor restore them, so a restore can never
bring back a used or revoked token).

Using a token is one compare-and-swap on its record: of two joins presenting the same token at
once, exactly one swaps `used_at` in; the other finds it used.
"""

from __future__ import annotations

import json
import time

from persys.security.join_tokens import Admission, JoinTokenError, JoinTokenRecord, admit, new_join_token, parse
from persys.store.base import StateStore

JOIN_TOKENS = "/persys-auth/join-tokens/"
MAX_LISTED = 1000


class JoinTokenStore:
    def __init__(self, store: StateStore) -> None:
        self.store = store

    async def create(self, ttl: float, node_id: str, created_by: str, description: str = ""
                     ) -> tuple[str, JoinTokenRecord]:
        token, record = new_join_token(ttl, node_id, created_by, time.time(), description)
        if await self.store.cas(JOIN_TOKENS + record.id, _encode(record), 0) is None:
            raise JoinTokenError("id: collision, try again")  # 31 bits: rare, and never overwritten
        return token, record

    async def list(self) -> list[JoinTokenRecord]:
        kvs, _ = await self.store.range(JOIN_TOKENS)
        return [JoinTokenRecord.from_doc(json.loads(kv.value)) for kv in kvs[:MAX_LISTED]]

    async def revoke(self, token_id: str, by: str) -> JoinTokenRecord | None:
        """The revoked record (None if there is no such token); a used or revoked one stays as it is."""
        while True:
            kv = await self.store.get(JOIN_TOKENS + token_id)
            if kv is None:
                return None
            record = JoinTokenRecord.from_doc(json.loads(kv.value))
            if record.revoked_at or record.used_at:
                return record
            done = record.revoked(by, time.time())
            if await self.store.cas(kv.key, _encode(done), kv.mod_revision) is not None:
                return done

    async def check(self, token: str, node_id: str) -> tuple[Admission, str, int]:
        """Whether `token` admits `node_id` now, the token's id ('' if malformed) and the record's
        revision to consume it at (0: nothing to consume)."""
        parts = parse(token)
        if parts is None:
            return Admission(refusal="malformed token (expected <id>.<secret>)", forged=True), "", 0
        kv = await self.store.get(JOIN_TOKENS + parts[0])
        record = JoinTokenRecord.from_doc(json.loads(kv.value)) if kv else None
        return admit(record, parts[1], node_id, time.time()), parts[0], kv.mod_revision if kv else 0

    async def consume(self, token_id: str, revision: int, node_id: str) -> bool:
        """Mark the token used by `node_id`, if nobody changed it since `revision` (True: ours)."""
        kv = await self.store.get(JOIN_TOKENS + token_id)
        if kv is None or kv.mod_revision != revision:
            return False
        record = JoinTokenRecord.from_doc(json.loads(kv.value)).used(node_id, time.time())
        return await self.store.cas(kv.key, _encode(record), revision) is not None


def _encode(record: JoinTokenRecord) -> bytes:
    return json.dumps(record.to_doc()).encode()
