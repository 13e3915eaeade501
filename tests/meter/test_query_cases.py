"""Persys Meter's pure decisions, from query_cases.yaml: which table serves a step, how a range is
split over the tables, which queries are refused (and the field named), rollup targets, counter
rates, retention options."""

from __future__ import annotations

from typing import Any

import pytest

from persys.meter.query import Query, QueryError, Retention, check, parse_retention, plan, rollup_target, serving_table
from persys.scheduler.work.telemetry import Seen, rates
from tests.cases import load

CASES: dict[str, list[dict[str, Any]]] = load(__file__, "query_cases.yaml")
TABLES = Retention().tables()


@pytest.mark.parametrize("case", CASES["serving_table"], ids=lambda c: f"step{c['step']}")
def test_serving_table(case: dict[str, Any]) -> None:
    assert serving_table(TABLES, case["step"]) == case["table"]


@pytest.mark.parametrize("case", CASES["plan"], ids=lambda c: c["what"])
def test_plan(case: dict[str, Any]) -> None:
    got = plan(TABLES, case["marks"], case["step"], case["start"], case["end"])
    assert [[s.table.name, s.start, s.end] for s in got] == case["segments"]


def _query(over: dict[str, Any]) -> Query:
    base = {"selector": "workload", "value": "web", "metric": "cpu", "start": 0.0, "end": 3600.0, "step": 60,
            "agg": "avg"}
    return Query(**{**base, **over})


@pytest.mark.parametrize("case", CASES["refused"], ids=lambda c: c["field"] + ":" + str(c["query"]))
def test_refused(case: dict[str, Any]) -> None:
    with pytest.raises(QueryError) as err:
        check(_query(case["query"]))
    assert err.value.field == case["field"]


@pytest.mark.parametrize("case", CASES["accepted"], ids=str)
def test_accepted(case: dict[str, Any]) -> None:
    q = _query(case["query"])
    assert check(q) is q


@pytest.mark.parametrize("case", CASES["rollup_target"], ids=str)
def test_rollup_target(case: dict[str, Any]) -> None:
    assert rollup_target(case["resolution"], case["now"], case["newest"], case["grace"]) == case["target"]


@pytest.mark.parametrize("case", CASES["rates"], ids=lambda c: c["what"])
def test_rates(case: dict[str, Any]) -> None:
    prev = Seen(case["prev"]["ts"], tuple(case["prev"]["counters"])) if case["prev"] else None  # type: ignore[arg-type]
    assert list(rates(prev, case["ts"], tuple(case["counters"]))) == case["rates"]  # type: ignore[arg-type]


@pytest.mark.parametrize("case", CASES["retention"], ids=lambda c: c["text"])
def test_retention(case: dict[str, Any]) -> None:
    if "refused" in case:
        with pytest.raises(QueryError) as err:
            parse_retention(case["text"])
        assert err.value.field == case["refused"]
    else:
        r = parse_retention(case["text"])
        assert [r.raw, r.minute, r.hour] == case["kept"]


@pytest.mark.parametrize("case", CASES["sparkline"], ids=str)
def test_sparkline(case: dict[str, Any]) -> None:
    from persys.cli.ctl.meter_cmds import sparkline

    assert sparkline([float(v) for v in case["values"]], case.get("width", 60)) == case["line"]
