"""Stored workloads the model refuses (written by an older, laxer version, a restore or by hand).

Such a document is kept out of the mirror's workloads, so nothing places or evaluates it, but
never deleted: its instances that have no node say why (phase Failed, reason InvalidSpec, the
model's problems with their field paths), the ones running keep running (agents still get the
stored spec), and `delete` still works (it marks the stored document deleting). Re-applying a
valid manifest of the same name replaces it. Pure: the mirror and the scheduler do the I/O.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from persys.model import Phase, Workload
from persys.model.manifest import format_validation_error
from persys.scheduler.decide.refused import INVALID_SPEC, RefusedWorkload, refused_status

__all__ = ["INVALID_SPEC", "RefusedWorkload", "marked_deleting", "parse_stored", "refused_status", "refused_view"]


def parse_stored(wid: str, value: bytes) -> Workload | RefusedWorkload:
    """The workload stored under `/persys/workloads/<wid>`, or why the model refuses it."""
    try:
        w = Workload.model_validate_json(value)
    except ValidationError as err:
        return RefusedWorkload(id=wid, problems=tuple(format_validation_error(err)[:20]), doc=_object(value))
    if w.id != wid:
        return RefusedWorkload(id=wid, problems=(f"id: {w.id!r} does not match its key",), doc=_object(value))
    return w


def _object(value: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def marked_deleting(r: RefusedWorkload, now: float) -> bytes:
    """The stored document with deletion requested (still refused: the deletion is finalised by
    the scheduler like any other)."""
    return json.dumps({**(r.doc or {"id": r.id}), "deleting": True, "updatedAt": now}).encode()


def refused_view(r: RefusedWorkload, instances: list[dict[str, Any]]) -> dict[str, Any]:
    """What `get workload` shows for it: the problems, and its instances as they are."""
    doc = r.doc or {}
    running = sum(1 for i in instances if i["phase"] == "Running")
    return {
        "id": r.id, "name": r.id, "type": str((doc.get("spec") or {}).get("type", "")) if isinstance(
            doc.get("spec"), dict) else "",
        "labels": doc.get("labels") if isinstance(doc.get("labels"), dict) else {},
        "desiredState": "Deleted" if r.deleting else "Invalid", "revision": str(doc.get("revision", "")),
        "generation": doc.get("generation", 0) if isinstance(doc.get("generation"), int) else 0,
        "replicas": len(instances), "ready": f"{running}/{len(instances)}", "phase": str(Phase.FAILED),
        "node": instances[0]["node"] if instances else "",
        "nodes": sorted({i["node"] for i in instances if i["node"]}),
        "reason": INVALID_SPEC, "message": r.message, "problems": list(r.problems),
        "instances": instances, "drift": [], "placement": {},
    }
