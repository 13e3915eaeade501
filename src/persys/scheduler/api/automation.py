"""Automation policies, the cluster-wide pause, and the decision log, in the state store.

    /persys/automation/policies/<name>          Policy: the spec, its version, who wrote it
    /persys/automation/paused                   {"paused", "by", "at", "reason"}: all automation off
    /persys-automation/decisions/<policy>/<id>  Decision: one decision (id = <ms, 13 digits>-<seq>)

Policies are cluster state (backed up with the rest of /persys/). Decisions are a log: they live
outside the mirror's prefix (the mirror never loads them at start, backups leave them out) and
only the newest KEEP_DECISIONS of each policy are kept. Any replica may serve these calls: they
read and write the store directly (compare-and-swap for policies), not the mirror.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from persys.model.automation import MAX_POLICIES, Decision, Outcome, Policy, PolicyManifest
from persys.model.manifest import ManifestError, format_validation_error
from persys.scheduler.errors import MutationRefused, NotFound
from persys.scheduler.work.shell import Shell
from persys.store.base import Compare, Delete, Put

POLICIES = "/persys/automation/policies/"
PAUSED = "/persys/automation/paused"
DECISIONS = "/persys-automation/decisions/"
KEEP_DECISIONS = 2_000  # per policy: at one decision every 15 s, over 8 hours
TRIM_SLACK = 100  # decisions past KEEP before a trim (a range and a delete) is paid for
MAX_RECORD = 100
MAX_LIST = 5_000
CAS_ATTEMPTS = 10


def policy_key(name: str) -> str:
    return POLICIES + name


def decision_prefix(policy: str) -> str:
    return f"{DECISIONS}{policy}/"


def decision_time(decision_id: str) -> float:
    return int(decision_id.split("-", 1)[0]) / 1000.0


class AutomationApi:
    def __init__(self, shell: Shell, clock: Callable[[], float] = time.time) -> None:
        self.s = shell
        self.clock = clock
        self._seq = itertools.count()
        self._since_trim: dict[str, int] = {}
        self.counter = shell.metrics.metrics.counter("persys_automation_decisions_total")
        self._last: dict[str, tuple[str, str, Any]] = {}  # per policy: the last decision's gist (events)

    # -- policies --------------------------------------------------------------------------------

    async def _load(self, name: str) -> tuple[Policy | None, int]:
        kv = await self.s.store.get(policy_key(name))
        if kv is None:
            return None, 0
        return Policy.model_validate_json(kv.value), kv.mod_revision

    async def apply(self, m: PolicyManifest, by: str, dry_run: bool = False) -> tuple[Policy, bool, bool]:
        """Create or replace; returns (policy, created, changed). The version grows with the spec."""
        if not dry_run:
            self.s.require_normal()
        name = m.metadata.name
        key = policy_key(name)
        for _ in range(CAS_ATTEMPTS):
            cur, rev = await self._load(name)
            now = self.clock()
            if cur is None:
                kvs, _ = await self.s.store.range(POLICIES)
                if len(kvs) >= MAX_POLICIES:
                    raise ManifestError([f"metadata.name: the cluster holds {len(kvs)} policies, the most it takes"])
                new = Policy(name=name, labels=m.metadata.labels, spec=m.spec, created_at=now, updated_at=now,
                             created_by=by, updated_by=by)
            elif cur.spec == m.spec and cur.labels == m.metadata.labels:
                return cur, False, False
            else:
                new = cur.model_copy(update={"spec": m.spec, "labels": m.metadata.labels, "updated_at": now,
                                             "updated_by": by,
                                             "version": cur.version + (cur.spec != m.spec)})
            if dry_run:
                return new, cur is None, True
            if await self.s.store.txn([Compare(key, rev)], [Put(key, new.to_json())]) is not None:
                self.s.emit("PolicyCreated" if cur is None else "PolicyUpdated", f"policy/{name}",
                            f"{new.spec.sort.value} policy, version {new.version}"
                            + (", dry run" if new.spec.dry_run else "") + (", paused" if new.spec.paused else ""))
                return new, cur is None, True
        raise MutationRefused(f"policy {name} is being changed concurrently; try again")

    async def get(self, name: str) -> Policy:
        cur, _ = await self._load(name)
        if cur is None:
            raise NotFound(f"policy {name}")
        return cur

    async def list_all(self) -> list[Policy]:
        kvs, _ = await self.s.store.range(POLICIES)
        return [Policy.model_validate_json(kv.value) for kv in kvs]

    async def delete(self, name: str) -> tuple[bool, bool]:
        self.s.require_normal()
        if not await self.s.store.delete(policy_key(name)):
            return False, True
        self.s.emit("PolicyDeleted", f"policy/{name}", "deleted (its decisions are kept until trimmed)")
        return True, False

    # -- pause -----------------------------------------------------------------------------------

    async def pause_state(self) -> dict[str, Any]:
        kv = await self.s.store.get(PAUSED)
        if kv is None:
            return {"paused": False, "by": "", "at": 0.0, "reason": ""}
        doc: dict[str, Any] = json.loads(kv.value)
        return doc

    async def set_pause(self, policy: str, paused: bool, by: str, reason: str) -> None:
        self.s.require_normal()
        word = "paused" if paused else "resumed"
        if not policy:
            doc = {"paused": paused, "by": by, "at": self.clock(), "reason": reason[:200]}
            await self.s.store.put(PAUSED, json.dumps(doc).encode())
            self.s.emit("AutomationPaused" if paused else "AutomationResumed", "automation",
                        f"all automation {word} by {by}" + (f": {reason[:200]}" if reason else ""))
            return
        key = policy_key(policy)
        for _ in range(CAS_ATTEMPTS):
            cur, rev = await self._load(policy)
            if cur is None:
                raise NotFound(f"policy {policy}")
            if cur.spec.paused == paused:
                return
            new = cur.model_copy(update={"spec": cur.spec.model_copy(update={"paused": paused}),
                                         "version": cur.version + 1, "updated_at": self.clock(), "updated_by": by})
            if await self.s.store.txn([Compare(key, rev)], [Put(key, new.to_json())]) is not None:
                self.s.emit("PolicyPaused" if paused else "PolicyResumed", f"policy/{policy}",
                            f"{word} by {by}, version {new.version}" + (f": {reason[:200]}" if reason else ""))
                return
        raise MutationRefused(f"policy {policy} is being changed concurrently; try again")

    # -- decisions -------------------------------------------------------------------------------

    def _new_id(self, ts: float) -> str:
        return f"{int(ts * 1000):013d}-{next(self._seq) % 10_000:04d}"

    async def record(self, raws: list[bytes], actor: str) -> list[str]:
        """Store each decision (validated: 400 naming the field, nothing written); an event for
        each one that is not a plain "nothing to do"."""
        if len(raws) > MAX_RECORD:
            raise ManifestError([f"decisions: {len(raws)} decisions exceeds {MAX_RECORD} per call"])
        decisions: list[Decision] = []
        for i, raw in enumerate(raws):
            try:
                decisions.append(Decision.model_validate_json(raw))
            except ValidationError as err:
                raise ManifestError([f"decisions[{i}].{p}" for p in format_validation_error(err)]) from None
        ops: list[Put | Delete] = []
        out = []
        for d in decisions:
            d.id = self._new_id(d.ts)
            d.actor = actor
            ops.append(Put(decision_prefix(d.policy) + d.id, d.to_json()))
            out.append(d)
        if ops:
            await self.s.store.txn([], ops)
        for d in out:
            self.counter.inc((d.sort.value, d.outcome.value, d.held_by or "none"))
            if _newsworthy(d, self._last.get(d.policy)):
                self.s.emit(_event_kind(d), f"policy/{d.policy}", _event_text(d))
            self._last[d.policy] = _gist(d)
            self._since_trim[d.policy] = self._since_trim.get(d.policy, 0) + 1
        for policy in {d.policy for d in out}:
            if self._since_trim.get(policy, 0) >= TRIM_SLACK:
                await self._trim(policy)
        return [d.id for d in out]

    async def _trim(self, policy: str) -> None:
        kvs, _ = await self.s.store.range(decision_prefix(policy))
        self._since_trim[policy] = 0
        extra = len(kvs) - KEEP_DECISIONS
        for start in range(0, max(extra, 0), 100):
            await self.s.store.txn([], [Delete(kv.key) for kv in kvs[start:min(start + 100, extra)]])

    async def list_decisions(self, policy: str, since: float, limit: int, outcome: str) -> list[dict[str, Any]]:
        limit = limit or 100
        if not 1 <= limit <= MAX_LIST:
            raise ManifestError([f"limit: {limit} is not between 1 and {MAX_LIST}"])
        if outcome and outcome not in {o.value for o in Outcome}:
            raise ManifestError([f"outcome: {outcome[:40]!r} is not one of {', '.join(o.value for o in Outcome)}"])
        # Ids are times: select by key, newest first, and parse only what is answered.
        raw: list[tuple[str, bytes]] = []
        async for kvs, _ in self.s.store.range_pages(decision_prefix(policy) if policy else DECISIONS):
            for kv in kvs:
                did = kv.key.rsplit("/", 1)[1]
                if not since or decision_time(did) >= since:
                    raw.append((did, kv.value))
        raw.sort(key=lambda pair: pair[0], reverse=True)
        found: list[Decision] = []
        for _, value in raw:
            d = Decision.model_validate_json(value)
            if outcome and d.outcome.value != outcome:
                continue
            found.append(d)
            if len(found) >= limit:
                break
        return [d.to_doc() for d in reversed(found)]


def _gist(d: Decision) -> tuple[str, str, Any]:
    return d.outcome.value, d.held_by, d.desired


def _newsworthy(d: Decision, last: tuple[str, str, Any] | None) -> bool:
    """Whether a decision is an event: every action done or failed; a dry-run action, a pause or
    a held change only when it differs from the policy's previous decision (a policy held at its
    maximum decides the same every interval: one event, not one per interval); never a plain
    "nothing to do" (within tolerance)."""
    if d.outcome in (Outcome.ACTED, Outcome.FAILED):
        return True
    if d.outcome == Outcome.NONE and d.held_by in ("", "tolerance"):
        return False
    return _gist(d) != last


def _event_kind(d: Decision) -> str:
    return {Outcome.ACTED: "AutomationActed", Outcome.DRY_RUN: "AutomationDryRun",
            Outcome.FAILED: "AutomationFailed", Outcome.PAUSED: "AutomationPausedDecision"}.get(d.outcome,
                                                                                              "AutomationHeld")


def _event_text(d: Decision) -> str:
    act = d.action or {}
    what = (f"{act.get('type')} {act.get('workload') or act.get('node') or ''} "
            f"{act.get('from', '')}->{act.get('to', '')}").strip() if act else "no action"
    held = f", held by {d.held_by}" if d.held_by else ""
    return f"v{d.policy_version} {d.outcome.value}: {what}{held}; {d.reason}"[:500]
