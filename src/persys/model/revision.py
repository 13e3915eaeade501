"""A workload's revision history: the specs applies wrote, kept by the scheduler (a bounded number
per workload) so that an operator can list them and roll back (`persysctl rollout history|undo`).

A record holds the spec applied at one generation (the new spec, not the one it replaced), so
the newest record is the spec in force and rolling back is applying an older record's spec.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictInt, StrictStr

from persys.model.base import Model
from persys.model.workload import WorkloadSpec

# The fields of a workload type's own section worth naming with their values in a summary.
_SHOWN = ("image", "command", "args", "kernel")
_RESOURCE_UNITS = {"cpuMillicores": ("cpu", "m"), "memoryMb": ("memory", "Mi"), "diskMb": ("disk", "Mi")}
VALUE_CHARS = 24  # a value longer than this is cut in a summary
SUMMARY_ITEMS = 4  # changes named in a summary; more are counted


class WorkloadRevision(Model):
    """One applied spec (key `/persys/revisions/<workload>/<generation>`)."""

    workload: StrictStr
    generation: Annotated[StrictInt, Field(ge=1)]
    revision: StrictStr  # the workload's revision then: its spec's content hash
    spec: WorkloadSpec
    created_at: float
    # The generation whose spec this one applied again (a rollback); unset: an ordinary apply.
    rollback_of: Annotated[StrictInt, Field(ge=1)] | None = None


def _text(value: Any) -> str:
    text = " ".join(map(str, value)) if isinstance(value, list) else "-" if value is None else str(value)
    return text or "-"


def _cut(text: str) -> str:
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def _pair(field: str, old: Any, new: Any) -> str:
    """`field old -> new`; of long values that start alike, where they differ (a tag, a flag)."""
    a, b = _text(old), _text(new)
    if max(len(a), len(b)) > VALUE_CHARS:
        shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        if shared > VALUE_CHARS // 2:
            a, b = "…" + a[shared - 4:], "…" + b[shared - 4:]
    return f"{field} {_cut(a)} -> {_cut(b)}"


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [k for k in sorted(before.keys() | after.keys()) if before.get(k) != after.get(k)]


def _typed_changes(kind: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What changed inside the workload type's own section (`process`, `container`, ...)."""
    out = []
    for field in _changed(before, after):
        if field in _SHOWN and field in before and field in after:
            out.append(_pair(field, before[field], after[field]))
        else:
            out.append(field if field in _SHOWN else f"{kind}.{field}")
    return out


def _resource_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = []
    for field in _changed(before, after):
        name, unit = _RESOURCE_UNITS.get(field, (field, ""))
        out.append(f"{name} {before.get(field, '-')}{unit} -> {after.get(field, '-')}{unit}")
    return out


def change_summary(before: WorkloadSpec | None, after: WorkloadSpec) -> str:
    """What `after` changed from `before` in a few words ("image a -> b, cpu 100m -> 200m");
    `before` None: the workload's first spec."""
    if before is None:
        return "created"
    a, b = before.to_doc(), after.to_doc()
    items: list[str] = []
    for field in _changed(a, b):
        old, new = a.get(field), b.get(field)
        if field == before.type == after.type and isinstance(old, dict) and isinstance(new, dict):
            items += _typed_changes(field, old, new)
        elif field == "resources" and isinstance(old, dict) and isinstance(new, dict):
            items += _resource_changes(old, new)
        elif field in ("type", "replicas", "desiredState", "restartPolicy"):
            items.append(_pair(field, old, new))
        elif field not in (before.type, after.type):  # a type change names the type, not both sections
            items.append(field)
    if not items:
        return "no change"
    more = len(items) - SUMMARY_ITEMS
    return ", ".join(items[:SUMMARY_ITEMS]) + (f", +{more} more" if more > 0 else "")
