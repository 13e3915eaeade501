"""One automation per cluster: the leader lease every `persys automation` process asks for each
tick (Automation.AutomationLease). The record lives at LEADER, attached to a store lease (etcd's,
or the embedded store's equivalent) of the holder's TTL: it vanishes by itself when its holder
stops renewing it (killed, frozen, cut off), and then the next caller takes it. Any replica may
serve it: it is the store's lease and compare-and-swap, nothing in memory.

The holder id names a process (host:pid:random), not an identity: every automation runs as the
same operator certificate."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from persys.model.manifest import ManifestError
from persys.scheduler.work.shell import Shell
from persys.store.base import Compare, LeaseNotFound, Put

LEADER = "/persys-automation/leader"  # outside the mirror's prefix: never loaded, never backed up
MAX_HOLDER = 200
TTL_RANGE = (2.0, 300.0)
ATTEMPTS = 5


class AutomationLease:
    def __init__(self, shell: Shell, clock: Callable[[], float] = time.time) -> None:
        self.s = shell
        self.clock = clock

    async def _read(self) -> tuple[dict[str, Any] | None, int]:
        kv = await self.s.store.get(LEADER)
        if kv is None:
            return None, 0
        doc: dict[str, Any] = json.loads(kv.value)
        return doc, kv.mod_revision

    async def ask(self, holder: str, ttl: float, release: bool, by: str) -> dict[str, Any]:
        """Take the lease if free, renew it if `holder` has it, or say who has it."""
        if not holder or len(holder) > MAX_HOLDER:
            raise ManifestError([f"holder: 1-{MAX_HOLDER} characters are required"])
        if not release and not TTL_RANGE[0] <= ttl <= TTL_RANGE[1]:
            raise ManifestError([f"ttl_seconds: {ttl} is not between {TTL_RANGE[0]:g} and {TTL_RANGE[1]:g}"])
        for _ in range(ATTEMPTS):
            cur, rev = await self._read()
            if cur is not None and cur.get("holder") == holder:
                mine = await self._release(cur, holder, by) if release else await self._renew(cur)
                if mine is None:
                    continue  # expired just now: its key is going; read again
                return mine
            if cur is not None:
                return {"held": False, **_public(cur)}
            if release:
                return {"held": False, "holder": "", "acquiredAt": 0.0, "term": 0}
            term = await self._term() + 1
            lease = await self.s.store.grant_lease(ttl)
            doc = {"holder": holder, "by": by, "acquiredAt": self.clock(), "term": term, "lease": lease}
            if await self.s.store.txn([Compare(LEADER, rev)], [Put(LEADER, json.dumps(doc).encode(), lease=lease),
                                                              Put(LEADER + "-term", str(term).encode())]) is not None:
                self.s.emit("AutomationLeader", "automation", f"{holder} ({by}) leads the automation, term {term}")
                return {"held": True, **_public(doc)}
            try:
                await self.s.store.revoke_lease(lease)
            except LeaseNotFound:
                pass
        cur, _ = await self._read()
        return {"held": False, **_public(cur or {})}

    async def _release(self, cur: dict[str, Any], holder: str, by: str) -> dict[str, Any]:
        """The holder gives the lead up: its lease revoked (the key goes with it)."""
        with contextlib.suppress(LeaseNotFound):
            await self.s.store.revoke_lease(int(cur["lease"]))
        self.s.emit("AutomationLeaderReleased", "automation", f"{holder} ({by}) gave up the lead")
        return {"held": False, "holder": "", "acquiredAt": 0.0, "term": int(cur.get("term", 0))}

    async def _renew(self, cur: dict[str, Any]) -> dict[str, Any] | None:
        """The holder keeps the lead: its lease renewed; None when it expired just now."""
        try:
            await self.s.store.keep_alive(int(cur["lease"]))
        except LeaseNotFound:
            return None
        return {"held": True, **_public(cur)}

    async def _term(self) -> int:
        kv = await self.s.store.get(LEADER + "-term")
        return int(kv.value) if kv is not None else 0


def _public(doc: dict[str, Any]) -> dict[str, Any]:
    return {"holder": str(doc.get("holder", "")), "acquiredAt": float(doc.get("acquiredAt", 0.0)),
            "term": int(doc.get("term", 0))}
