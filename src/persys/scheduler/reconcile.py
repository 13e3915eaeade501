"""Reconciliation as a pure decision: now `decide.reconcile` (the plan in intents, not store
keys); this module keeps the names its callers import until the packages are rearranged."""

from __future__ import annotations

from persys.scheduler.decide.effects import Event, Need, Write
from persys.scheduler.decide.reconcile import (
    Plan,
    RunsOn,
    deletion_writes,
    orphan_writes,
    plan,
    refused_writes,
    relocation,
    still_on_old_node,
    sync_write,
)

__all__ = ["Event", "Need", "Plan", "RunsOn", "Write", "deletion_writes", "orphan_writes", "plan", "refused_writes",
           "relocation", "still_on_old_node", "sync_write"]
