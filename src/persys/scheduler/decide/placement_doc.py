"""What a status keeps of a placement decision (pure): compact scores, the explanation, a
pending decision's failing filters and rejection codes."""

from __future__ import annotations

from typing import Any

from persys.scheduler import placement as pl
from persys.scheduler.placement.verdicts import Rejections


def placement_doc(decision: pl.Decision, explanation: str, seen: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a status keeps of a decision: the explanation and the top candidates' scores. The
    per-node rejections are summarised in the explanation, never stored one by one: at thousands
    of nodes they would make every status document tens of kilobytes. Scores are kept compact,
    [node, total, [contribution per scorer]] with the scorer names once (a status per instance
    is held in memory: this is most of its size); `placement_view` expands them for people."""
    names = list(decision.scores[0].breakdown) if decision.scores else []
    return {
        "node_id": decision.node_id,
        "feasible": decision.feasible,
        "total": decision.total,
        "evaluated": decision.evaluated,
        "scorers": names,
        "scores": [[s.node_id, round(s.total, 3), [round(s.breakdown[k], 3) for k in names]]
                   for s in decision.scores],
        "explanation": explanation,
        **({"reasons": reasons_doc(decision)} if decision.reasons else {}),
        # Pending: the codes nodes were rejected with (queueing hints: which node changes help).
        **({"codes": sorted(_codes(decision))} if decision.node_id is None else {}),
        # What the decision saw beyond the store, for `explain --at` (placement.record).
        **({"seen": seen} if seen else {}),
        **({"devices": list(decision.devices)} if decision.devices else {}),  # the GPUs it was given
    }


def _codes(decision: pl.Decision) -> set[str]:
    rejections = decision.rejections
    if isinstance(rejections, Rejections):
        return set(rejections.code_counts())
    return {st.code for st in rejections.values()}


def reasons_doc(decision: pl.Decision) -> dict[str, list[dict[str, Any]]]:
    """A pending decision's every failing filter per detailed node: code and message, with the
    figures (needed, available, shortBy, unit) of a fit failure."""
    out: dict[str, list[dict[str, Any]]] = {}
    for node_id, statuses in decision.reasons.items():
        items = []
        for st in statuses:
            item: dict[str, Any] = {"code": st.code, "message": st.message}
            if st.needed is not None:
                item.update(needed=st.needed, available=st.available, shortBy=st.short_by, unit=st.unit)
            items.append(item)
        out[node_id] = items
    return out
