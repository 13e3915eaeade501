"""Relocating off a node whose disk is filling, from Persys Intelligence's forecast.

The automation reads Intelligence's disk-space forecasts through the `seams.DiskForecasts`
Protocol, in the shape of the forecast output (`intelligence.forecast.Forecast.to_dict()`). Here
a stand-in for that seam serves forecasts in that shape: table cases (disk_filling_cases.yaml)
through the pure plan, one real forecast made by Intelligence's own model from a filling series,
and the remediate edge with the stand-in (the running adapter, disk_forecasts.NodeDiskForecasts,
over a real meter: test_disk_forecasts_adapter.py and test_disk_remediate_dev.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.automation import remediate as rm
from persys.automation.remediate_run import RemediateLoop
from persys.intelligence.forecast import forecast
from persys.model.automation import Policy, Remediate

CASES: list[dict[str, Any]] = yaml.safe_load((Path(__file__).parent / "disk_filling_cases.yaml").read_text())
NOW = 1_000_000.0
GIB = 2**30


def shaped(f: dict[str, Any]) -> dict[str, Any]:
    """A case's forecast in Forecast.to_dict()'s shape: [[t, point, lower80, upper80], ...]."""
    return {"node": f["node"], "capacityBytes": f["capacityGiB"] * GIB, "evidence": f"forecast/{f['node']}",
            "forecast": {"points": [[NOW + h * 3600, p * GIB, lo * GIB, p * GIB * 1.1] for h, p, lo in f["points"]],
                         "unpredictable": f.get("unpredictable", False), "mase": 0.4}}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_plan(case: dict[str, Any]) -> None:
    spec = Remediate.model_validate({"restartUnhealthy": False, **case["spec"]})
    assert spec.relocate_on_disk_filling is not None
    full = rm.filling(spec.relocate_on_disk_filling, NOW, [shaped(f) for f in case["forecasts"]])
    got = rm.plan(spec, NOW, [rm.Failure(NOW - ago, n, "w", f"e{i}") for i, (ago, n) in
                              enumerate(case.get("failures", []))],
                  [rm.NodeView(n, c) for n, c in case["nodes"]], [],
                  [rm.Done(NOW - ago, t, target) for ago, t, target in case.get("done", [])], full,
                  [rm.Placed(p[0], p[1], p[2], p[3] if len(p) > 3 else False) for p in case["placed"]])
    assert [[p.type, p.target, p.held_by] for p in got] == case["expect"], [p.reason for p in got]
    assert all(p.reason for p in got)
    assert all(p.evidence == (f"forecast/{p.target}",) for p in got if p.type == "cordon" and not p.held_by
               and not case.get("failures"))


def test_a_real_forecast_of_a_filling_disk() -> None:
    """Intelligence's own model over a disk filling 1 GiB an hour (70 GiB of 100 now), with noise:
    its forecast, as it answers it, reaches 95 % within a day; a flat series does not."""
    step = 300.0
    start = NOW - 3 * 86400
    noise = [((i * 7919) % 13 - 6) * 0.002 * GIB for i in range(int(3 * 86400 / step))]
    filling = [(start + i * step, (70 - 72 + i * step / 3600) * GIB + noise[i]) for i in range(len(noise))]
    flat = [(t, 40 * GIB + n) for (t, _), n in zip(filling, noise, strict=True)]
    spec = Remediate.model_validate({"relocateOnDiskFilling": {"withinHours": 36, "fullPercent": 95}})
    assert spec.relocate_on_disk_filling is not None
    items = [{"node": n, "capacityBytes": 100 * GIB, "evidence": n,
              "forecast": forecast(series, step, 36 * 3600).to_dict()} for n, series in (("n1", filling), ("n2", flat))]
    now = filling[-1][0]
    full = rm.filling(spec.relocate_on_disk_filling, now, items)
    assert [f.node for f in full] == ["n1"], [(i["node"], i["forecast"]["verdict"]) for i in items]
    assert 20 * 3600 < full[0].eta - now < 30 * 3600, full[0].reason  # 25 GiB at 1 GiB/h, lower bound a bit later


class StandInDiskForecasts:
    """A stand-in for Persys Intelligence's disk forecasts (seams.DiskForecasts) serving given
    items in its shape, recording what the policy asked for."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.asked: list[tuple[float, float]] = []

    async def disk_forecasts(self, history_seconds: float, horizon_seconds: float) -> list[dict[str, Any]]:
        self.asked.append((history_seconds, horizon_seconds))
        return self.items


class RecordingApi:
    """The client API the remediate edge calls, recording the actions (the rest is tested
    against a real scheduler in test_remediate_e2e and test_rebalance_dev)."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, ...]] = []

    async def events(self, limit: int = 100, subject: str = "") -> list[dict[str, Any]]:
        return []

    async def list_nodes(self) -> list[dict[str, Any]]:
        return [{"id": "n1", "cordoned": False}, {"id": "n2", "cordoned": False}]

    async def list_workloads(self, node_id: str = "") -> list[dict[str, Any]]:
        return [{"id": "web"}] if node_id in ("", "n1") else []

    async def get_workload(self, workload_id: str) -> dict[str, Any]:
        return {"name": "web", "spec": {"type": "process"},
                "instances": [{"instance": "web", "node": "n1", "phase": "Running"}]}

    async def list_decisions(self, *args: Any) -> list[dict[str, Any]]:
        return []

    async def cordon(self, node_id: str, on: bool) -> dict[str, Any]:
        self.actions.append(("cordon", node_id))
        return {}

    async def move_instance(self, workload_id: str, instance: str, to_node: str = "", dry_run: bool = False
                            ) -> dict[str, Any]:
        self.actions.append(("move", workload_id, instance))
        return {"instance": instance, "from": "n1", "to": "n2"}


def test_the_remediate_edge_reads_the_seam_and_acts() -> None:
    api = RecordingApi()
    disk = StandInDiskForecasts([shaped({"node": "n1", "capacityGiB": 100, "points": [[3, 99, 97]]})])
    policy = Policy.model_validate({"name": "disk", "version": 1, "createdAt": NOW, "updatedAt": NOW,
                                    "spec": {"remediate": {"restartUnhealthy": False,
                                                           "relocateOnDiskFilling": {"withinHours": 24}}}})
    loop = RemediateLoop(api, disk=disk)  # type: ignore[arg-type]
    base = {"ts": NOW, "policy": "disk", "policy_version": 1, "sort": policy.spec.sort, "dry_run": False}
    decisions = asyncio.run(loop.decide(policy, NOW, base))
    assert api.actions == [("cordon", "n1"), ("move", "web", "web")]
    assert disk.asked == [(7 * 86400, 24 * 3600)]  # historyHours (a week by default), withinHours
    assert [d.outcome.value for d in decisions] == ["acted", "acted"]
    assert all(any(e.source == "intelligence" and e.ref == "forecast/n1" for e in d.evidence) for d in decisions)
    # Without a source the policy says so instead of acting.
    none = asyncio.run(RemediateLoop(RecordingApi()).decide(policy, NOW, base))  # type: ignore[arg-type]
    assert "no source" in none[0].inputs["diskFilling"]
