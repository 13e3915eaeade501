"""The decision log in a real state store (SQLite): ids in time order, filters, the newest kept
per policy and the oldest trimmed, and a refused record writes nothing. The scheduler around the
store is reduced to what AutomationApi uses (store, metrics, events, the mode check)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from persys.model.manifest import ManifestError
from persys.observability.metrics import Metrics
from persys.scheduler.api import automation as aa
from persys.scheduler.work.metrics import ReplicaMetrics
from persys.store.sqlite import SqliteStore


class Shell:
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.metrics = ReplicaMetrics(Metrics(process=False))
        self.events: list[tuple[str, str, str]] = []

    def emit(self, kind: str, subject: str, message: str, reason: str = "", node: str = "") -> None:
        self.events.append((kind, subject, message))

    def require_normal(self) -> None:
        return None


def decision(ts: float, policy: str = "p", outcome: str = "none", held: str = "") -> bytes:
    return json.dumps({"ts": ts, "policy": policy, "policyVersion": 1, "sort": "autoscale", "outcome": outcome,
                       "heldBy": held, "reason": "r"}).encode()


async def test_record_list_trim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aa, "KEEP_DECISIONS", 30)
    monkeypatch.setattr(aa, "TRIM_SLACK", 10)
    store = SqliteStore(tmp_path / "state.db")
    shell = Shell(store)
    api = aa.AutomationApi(shell)  # type: ignore[arg-type]
    try:
        t0 = 1_800_000_000.0
        for i in range(0, 60, 5):
            await api.record([decision(t0 + i + k) for k in range(5)], "user:auto")
        await api.record([decision(t0 + 100, "q", "acted"), decision(t0 + 101, "q", "none", "tolerance")],
                         "user:auto")
        mine: list[dict[str, Any]] = await api.list_decisions("p", 0, 5000, "")
        assert 30 <= len(mine) < 40  # trimmed to the newest 30 at each 10th record
        assert [d["ts"] for d in mine] == sorted(d["ts"] for d in mine) and mine[-1]["ts"] == t0 + 59
        assert all(d["actor"] == "user:auto" for d in mine)
        assert [d["ts"] for d in await api.list_decisions("p", t0 + 55, 5000, "")] == [t0 + k for k in range(55, 60)]
        assert [d["ts"] for d in await api.list_decisions("p", 0, 3, "")] == [t0 + 57, t0 + 58, t0 + 59]
        everything = await api.list_decisions("", 0, 5000, "")
        assert everything[-2:] == await api.list_decisions("q", 0, 5000, "")
        assert [d["outcome"] for d in await api.list_decisions("", 0, 5000, "acted")] == ["acted"]
        # Events: the action only (plain "nothing" and tolerance are not news).
        assert [k for k, _, _ in shell.events] == ["AutomationActed"]
        with pytest.raises(ManifestError, match=r"decisions\[1\]\.heldBy"):
            await api.record([decision(t0 + 200, "r"), decision(t0 + 201, "r", held="whim")], "user:auto")
        assert await api.list_decisions("r", 0, 5000, "") == []  # nothing of a refused call
        with pytest.raises(ManifestError, match="limit"):
            await api.list_decisions("p", 0, 6000, "")
        with pytest.raises(ManifestError, match="outcome"):
            await api.list_decisions("p", 0, 10, "maybe")
        # A policy held at the same count decides the same every interval: one event, then one per change.
        shell.events.clear()
        for k in range(3):
            await api.record([decision(t0 + 300 + k, "h", "none", "max")], "user:auto")
        await api.record([decision(t0 + 310, "h", "none", "stabilization")], "user:auto")
        await api.record([decision(t0 + 311, "h", "dry-run"), decision(t0 + 312, "h", "dry-run")], "user:auto")
        assert [k for k, _, _ in shell.events] == ["AutomationHeld", "AutomationHeld", "AutomationDryRun"]
        counted = shell.metrics.metrics.counter("persys_automation_decisions_total")
        assert counted.value(("autoscale", "none", "none")) == 60
        assert counted.value(("autoscale", "none", "tolerance")) == counted.value(("autoscale", "acted", "none")) == 1
    finally:
        await store.close()
