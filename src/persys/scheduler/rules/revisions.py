"""A workload's revision history as pure decisions: which records an apply writes and prunes (in
the same transaction as the workload's document), which kept generation a rollback goes back to,
and the history as clients see it. The I/O is the callers' (api/workloads.py).

Each apply that changes a workload's spec (a new generation) writes the NEW spec as a record at
that generation: the newest record is the spec in force, and a rollback applies an older one
again, which becomes a newer record (as kubectl does). Start, stop and restart bump the
generation without a record: they change no manifest. At most KEEP_REVISIONS records are kept per
workload; a record that would push its write past the store's request limit is left out (the
apply still lands; that generation is missing from the history).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from persys.model.manifest import ManifestError
from persys.model.revision import WorkloadRevision, change_summary
from persys.model.workload import Workload
from persys.scheduler.mirror import keys
from persys.store.base import Compare, Delete, Put, txn_bytes

KEEP_REVISIONS = 10  # records kept per workload, the spec in force included


def pruned(kept: Iterable[int], new: int, keep: int = KEEP_REVISIONS, fresh: bool = False) -> list[int]:
    """The generations whose records go when the record of generation `new` is written: all but
    the newest `keep` (`new` counted). `fresh`: the workload is being created, and records left
    by an earlier workload of the same name (a deletion that missed them) all go."""
    old = set(kept) - {new}
    if fresh:
        return sorted(old)
    survivors = sorted(old | {new}, reverse=True)[:keep]
    return sorted(old - set(survivors))


def record_ops(w: Workload, kept: Iterable[int], now: float, fresh: bool = False,
               rollback_of: int | None = None) -> list[Put | Delete]:
    """The record of `w`'s spec at its generation, and the deletes of what it prunes."""
    record = WorkloadRevision(workload=w.id, generation=w.generation, revision=w.revision, spec=w.spec,
                              created_at=now, rollback_of=rollback_of)
    return [Put(keys.revision(w.id, w.generation), record.to_json()),
            *[Delete(keys.revision(w.id, g)) for g in pruned(kept, w.generation, fresh=fresh)]]


def with_record(compares: Sequence[Compare], ops: list[Put | Delete], record: list[Put | Delete],
                limit: int) -> list[Put | Delete]:
    """`ops` with the revision record's ops when the whole write stays within `limit` bytes; else
    `ops` alone (a spec near the limit is applied all the same, unrecorded)."""
    both = [*ops, *record]
    return both if txn_bytes(compares, both) <= limit else ops


def rollback_target(workload: str, generations: Sequence[int], requested: int) -> int:
    """The kept generation a rollback applies: `requested`, or (0) the one before the newest.
    Refused with a ManifestError naming `generation` when there is no such record."""
    kept = sorted(generations)
    if requested == 0:
        if len(kept) < 2:
            raise ManifestError([f"generation: workload {workload!r} has no earlier revision to roll back to "
                                 f"(kept: {', '.join(map(str, kept)) or 'none'})"])
        return kept[-2]
    if requested not in kept:
        raise ManifestError([f"generation: workload {workload!r} has no revision at generation {requested} "
                             f"(kept: {', '.join(map(str, kept)) or 'none'}; see persysctl rollout history "
                             f"{workload})"])
    return requested


def history(records: Sequence[WorkloadRevision]) -> list[dict[str, Any]]:
    """The records as clients see them, oldest first: each with what it changed from the one
    before it (the oldest kept one: from nothing it can see, unless it is generation 1)."""
    out = []
    prev: WorkloadRevision | None = None
    for i, r in enumerate(records):
        if prev is not None:
            change = change_summary(prev.spec, r.spec)
        else:
            change = change_summary(None, r.spec) if r.generation == 1 else "(earlier revisions pruned)"
        if r.rollback_of is not None:
            change = f"rollback to {r.rollback_of}: {change}"
        out.append({"workload": r.workload, "generation": r.generation, "revision": r.revision,
                    "createdAt": r.created_at, "change": change, "rollbackOf": r.rollback_of,
                    "current": i == len(records) - 1,  # the newest record is the spec in force
                    "spec": r.spec.to_doc()})
        prev = r
    return out
