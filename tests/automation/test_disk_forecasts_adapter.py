"""The automation's source of Persys Intelligence's disk forecasts (automation/disk_forecasts.py).

Table cases for its pure part (capacity from the node's advertisement, the horizon cap), then the
adapter over an API answering the meter's node series from given points: its items are exactly
what Intelligence's own forecast (`forecast_usage` through Intelligence's UsageReader, what
`persysctl forecast node N --metric disk` answers) says for the same series, it reads only the
meter's `disk-used` series and the node list (a viewer's reads), and it fits a node once per
meter step. The real meter and processes: test_disk_remediate_dev.py."""

from __future__ import annotations

from typing import Any

import pytest

from persys.automation.disk_forecasts import NodeDiskForecasts, capacity_bytes, entry, horizon_for
from persys.intelligence.analyses import forecast_usage
from persys.intelligence.retriever import UsageReader
from tests.cases import load

CASES = load(__file__, "disk_adapter_cases.yaml")
GIB = 2**30
NOW = 1_800_000_000.0


@pytest.mark.parametrize("case", CASES["capacity"], ids=[c["name"] for c in CASES["capacity"]])
def test_capacity(case: dict[str, Any]) -> None:
    assert capacity_bytes(case["node"]) == case["bytes"]


@pytest.mark.parametrize("case", CASES["horizon"], ids=[c["name"] for c in CASES["horizon"]])
def test_horizon(case: dict[str, Any]) -> None:
    assert horizon_for(case["history"], case["asked"]) == case["got"]


def test_an_entry_cites_the_series_the_forecast_read() -> None:
    f = {"evidence": ["meter:node/n1/disk-used/avg/10s@1-2"], "verdict": "forecast"}
    assert entry({"id": "n1", "capabilities": {"diskMb": 2}}, f) == {
        "node": "n1", "capacityBytes": 2 * 2**20, "evidence": "meter:node/n1/disk-used/avg/10s@1-2", "forecast": f}
    assert entry({"id": "n2"}, {"evidence": []})["evidence"] == ""


class MeterApi:
    """Answers list_nodes and the meter's node series from given points, the way the scheduler's
    Meter/Query answers (a stand-in for the meter here; the dev e2e reads the real one). Any
    other call is an AttributeError: the adapter makes no other."""

    def __init__(self, points: dict[str, list[tuple[float, float]]], disk_mb: dict[str, int]) -> None:
        self.points = points
        self.disk_mb = disk_mb
        self.asked: list[tuple[str, str, str, float, int, str]] = []

    async def list_nodes(self) -> list[dict[str, Any]]:
        return [{"id": n, "capabilities": {"diskMb": self.disk_mb[n]}} for n in self.points]

    async def meter_query(self, selector: str, value: str, metric: str, since: float, step: int, agg: str
                          ) -> dict[str, Any]:
        self.asked.append((selector, value, metric, since, step, agg))
        pts = self.points[value]
        return {"start": pts[0][0], "end": pts[-1][0], "series": [{"key": value, "points": [list(p) for p in pts]}]}


def series(rate_gib_per_hour: float, base_gib: float) -> list[tuple[float, float]]:
    """Six minutes at 10 s, growing at a rate, with a little deterministic noise."""
    return [(NOW - (36 - i) * 10, (base_gib + rate_gib_per_hour * i * 10 / 3600) * GIB + ((i * 7919) % 13 - 6) * 2**20)
            for i in range(36)]


async def test_the_adapter_answers_intelligences_own_forecast() -> None:
    api = MeterApi({"fill": series(36.0, 90), "calm": series(0.0, 40)}, {"fill": 100 * 1024, "calm": 100 * 1024})
    clock = [NOW]
    disk = NodeDiskForecasts(api, clock=lambda: clock[0])
    got = await disk.disk_forecasts(360, 3600)
    assert [g["node"] for g in got] == ["calm", "fill"]  # by id
    assert {a[:3] + a[4:] for a in api.asked} == {("node", "fill", "disk-used", 10, "avg"),
                                                  ("node", "calm", "disk-used", 10, "avg")}
    for g in got:
        own = await forecast_usage(UsageReader(api), "node", g["node"], "disk", 360, 3600)  # type: ignore[arg-type]
        assert g["forecast"] == own
        assert g["capacityBytes"] == 100 * GIB and g["evidence"] == own["evidence"][0]
    fill = got[1]["forecast"]
    assert fill["verdict"] == "forecast" and fill["points"][-1][2] > 95 * GIB, fill  # 36 GiB/h: full within the hour

    # Within one meter step the fit is kept (no newer sample could change it); after it, refitted.
    asked = len(api.asked)
    again = await disk.disk_forecasts(360, 3600)
    assert again == got and len(api.asked) == asked
    clock[0] += 10
    await disk.disk_forecasts(360, 3600)
    assert len(api.asked) == asked + 2


async def test_nodes_past_the_bound_are_said_not_forecast() -> None:
    api = MeterApi({f"n{i}": series(0.0, 10) for i in range(3)}, {f"n{i}": 1024 for i in range(3)})
    disk = NodeDiskForecasts(api, max_nodes=2)
    got = await disk.disk_forecasts(360, 3600)
    assert [g["node"] for g in got] == ["n0", "n1"] and disk.note == "1 nodes past the first 2 not forecast"
