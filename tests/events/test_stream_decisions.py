"""The live event stream's pure decisions (persys.events.filters), table-driven from stream_cases/:
which events a filter keeps, where a stream starts and when it reports a gap, `since` parsing;
and the SSE framing persysctl reads back (cli.ctl.follow.SseParser over gateway.routes.streams)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys._pb.persys.v1 import watch_pb2
from persys.cli.ctl.follow import SseParser
from persys.events.base import ClusterEvent
from persys.events.filters import FilterError, check_id, keep_last, make_filter, parse_since, start_of
from persys.gateway.routes.streams import event_frame
from persys.scheduler.rpc.client.watch import select
from tests.cases import load

CASES = Path(__file__).parent / "stream_cases"


def _load(name: str) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = load(CASES, name)
    return cases


FILTERS, STARTS, SINCE = _load("filters.yaml"), _load("starts.yaml"), _load("since.yaml")


@pytest.mark.parametrize("case", FILTERS, ids=[c["name"] for c in FILTERS])
def test_filter(case: dict[str, Any]) -> None:
    f = case["filter"]
    if "error" in case:
        with pytest.raises(FilterError, match=case["error"]):
            make_filter(f.get("kinds", []), f.get("subject", ""), f.get("node", ""))
        return
    flt = make_filter(f.get("kinds", []), f.get("subject", ""), f.get("node", ""))
    e = case["event"]
    ev = ClusterEvent(kind=e["kind"], subject=e["subject"], message="m", fields=e.get("fields", {}))
    assert flt.matches(ev) is case["keep"]


@pytest.mark.parametrize("case", STARTS, ids=[c["name"] for c in STARTS])
def test_start(case: dict[str, Any]) -> None:
    start = start_of(case["since_id"], case.get("since", 0.0), case["oldest"], case["last"], 10_000)
    assert start.after == case["expect"]["after"]
    if case["expect"]["gap"]:
        assert case["expect"]["gap"] in start.gap
    else:
        assert start.gap == ""


@pytest.mark.parametrize("case", SINCE, ids=[c["text"] for c in SINCE])
def test_since(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(FilterError, match=case["error"]):
            parse_since(case["text"], 1_000_000.0)
        return
    assert parse_since(case["text"], 1_000_000.0) == pytest.approx(case["expect"])


@pytest.mark.parametrize("value", ["", "1", "a-1", "1-", "-1", "1-2-3", "1234567890123456-0", "1-18446744073709551616"])
def test_bad_event_ids_are_refused_naming_the_field(value: str) -> None:
    with pytest.raises(FilterError, match=r"^sinceId:"):
        check_id(value)


def test_keep_last_filters_then_keeps_the_newest() -> None:
    docs = [{"id": f"{i}-0", "ts": float(i), "kind": "A" if i % 2 else "B", "subject": "cluster"} for i in range(10)]
    kept = keep_last(docs, make_filter(["A"]), since=2.0, limit=3)
    assert [d["id"] for d in kept] == ["5-0", "7-0", "9-0"]


def test_sse_frames_parse_back_with_their_ids() -> None:
    msgs = [watch_pb2.WatchEventMessage(id="5-0", gap="events after 1-0 may be lost"),
            watch_pb2.WatchEventMessage(id="7-0", events=[
                watch_pb2.WatchedEvent(id="6-0", json=b'{"id":"6-0","kind":"NodeReady"}'),
                watch_pb2.WatchedEvent(id="6-1", json=b'{"id":"6-1","kind":"NodeReady"}')]),
            watch_pb2.WatchEventMessage(id="9-2")]
    parser = SseParser()
    frames = [f for m in msgs for line in event_frame(m).split("\n") if (f := parser.feed(line)) is not None]
    assert [(f.event, f.id) for f in frames] == [("gap", "5-0"), ("", "6-0"), ("", "6-1"), ("", "9-2")]
    assert frames[1].data == ['{"id":"6-0","kind":"NodeReady"}'] and frames[3].data == []


def test_a_batch_stops_at_the_limit_and_its_position_follows_what_was_looked_at() -> None:
    batch = [ClusterEvent(kind=k, subject="cluster", message="", id=f"{i}-0")
             for i, k in enumerate(["A", "B", "A", "A", "B"], start=1)]
    events, cursor, left = select(batch, make_filter(["A"]), 2)
    assert ([e.id for e in events], cursor, left) == (["1-0", "3-0"], "3-0", 0)
    events, cursor, left = select(batch, make_filter(["A"]), -1)
    assert ([e.id for e in events], cursor, left) == (["1-0", "3-0", "4-0"], "5-0", -1)
