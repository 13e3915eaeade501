"""Lost-event accounting: the ledger (table-driven from loss_cases/cases.yaml) and the outbox
that turns it into an EventsLost gap event ahead of newer events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from persys.events.base import ClusterEvent
from persys.events.loss import GAP_KIND, LossLedger, LostSpan, gap_event
from persys.events.memory import MemoryEventBus
from persys.events.outbox import EventOutbox
from tests.cases import load

CASES = load(__file__, "loss_cases/cases.yaml")


def _check_span(span: LostSpan | None, want: dict[str, Any] | None) -> None:
    if want is None or not want.get("count"):
        assert span is None or span.count == 0, span
        return
    assert span is not None
    assert (span.count, span.first_ts, span.last_ts) == (want["count"], want["first"], want["last"])
    if "causes" in want:
        assert span.causes == frozenset(want["causes"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_ledger_case(case: dict[str, Any]) -> None:
    ledger = LossLedger(log_interval=case.get("log_interval", 30.0))
    taken: LostSpan | None = None
    for step in case["steps"]:
        if "record" in step:
            events = [ClusterEvent(kind="K", subject="s", message="", ts=t) for t in step["record"]]
            assert ledger.record(events, step["cause"], step["now"]) == step["logs"], step
        elif "take" in step:
            taken = ledger.take()
            _check_span(taken, step["take"])
        elif "restore" in step:
            assert taken is not None
            ledger.restore(taken)
    want = case["expect"]
    assert (ledger.total, ledger.last_drop_at) == (want["total"], want["last_drop_at"])
    _check_span(ledger.pending, want["pending"])
    assert ledger.health() == {"eventsDropped": want["total"], "eventsLastDropAt": want["last_drop_at"],
                               "eventsDropsUnreported": want["pending"]["count"]}


def test_gap_event_names_count_range_and_replica() -> None:
    span = LostSpan(180, 1_700_000_000.5, 1_700_000_030.25, frozenset({"EventBusUnavailable"}))
    ev = gap_event(span, "r0")
    assert (ev.kind, ev.subject, ev.reason) == (GAP_KIND, "replica/r0", "EventBusUnavailable")
    assert ev.fields == {"count": "180", "from": "1700000000.5", "to": "1700000030.25", "replica": "r0",
                         "causes": "EventBusUnavailable"}
    assert "180 events lost" in ev.message and "r0" in ev.message


class SwitchableBus(MemoryEventBus):
    """The real in-process bus, made to refuse publishes while `down` (as the Redis backend does
    when Redis is unreachable: ids of ""). The chaos test does this with a real Redis."""

    down = False

    async def publish_many(self, events: Sequence[ClusterEvent]) -> list[str]:
        if self.down:
            return [""] * len(events)
        return await super().publish_many(events)


def ev(i: int, ts: float) -> ClusterEvent:
    return ClusterEvent(kind="WorkloadScheduled", subject=f"workload/w{i}", message=f"m{i}", ts=ts)


async def test_outbox_announces_bus_outage_before_newer_events() -> None:
    bus = SwitchableBus()
    box = EventOutbox(bus, "r0", clock=lambda: 500.0)
    await box.publish([ev(0, 100)])
    bus.down = True
    await box.publish([ev(1, 101), ev(2, 102)])
    await box.publish([ev(3, 103)])
    assert box.ledger.health() == {"eventsDropped": 3, "eventsLastDropAt": 500.0, "eventsDropsUnreported": 3}
    await box.publish([])  # the gap alone, retried while still down: kept pending
    assert box.ledger.pending.count == 3 and box.ledger.total == 3
    bus.down = False
    await box.publish([ev(4, 104)])
    got = await bus.recent()
    assert [e.kind for e in got] == ["WorkloadScheduled", GAP_KIND, "WorkloadScheduled"]
    gap = got[1]
    assert gap.fields["count"] == "3" and (gap.fields["from"], gap.fields["to"]) == ("101", "103")
    assert box.ledger.health()["eventsDropsUnreported"] == 0 and box.ledger.total == 3


async def test_outbox_counts_a_full_queue() -> None:
    bus = MemoryEventBus()
    box = EventOutbox(bus, "r1", maxsize=2, clock=lambda: 7.0)
    for i in range(5):
        box.emit(ev(i, 10 + i))
    assert box.ledger.health() == {"eventsDropped": 3, "eventsLastDropAt": 7.0, "eventsDropsUnreported": 3}
    queued = [box._q.get_nowait() for _ in range(2)]
    await box.publish(queued)
    got = await bus.recent()
    assert [e.kind for e in got] == [GAP_KIND, "WorkloadScheduled", "WorkloadScheduled"]
    assert got[0].reason == "PublishQueueFull" and got[0].fields["count"] == "3"
    assert (got[0].fields["from"], got[0].fields["to"]) == ("12", "14")
    assert [e.message for e in got[1:]] == ["m0", "m1"]
