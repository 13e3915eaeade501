"""Pure: the rebalance plan (rebalance_cases.yaml): each move verified by the placement engine
over the cluster after the moves before it, within budgets, holding back what moved recently."""

from __future__ import annotations

from typing import Any

import pytest

from persys.automation.rebalance import Placed, plan
from persys.model.automation import Rebalance
from persys.scheduler import placement as pl
from tests.cases import load

CASES: list[dict[str, Any]] = load(__file__, "rebalance_cases.yaml")
NOW = 1_000_000.0


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_plan(case: dict[str, Any]) -> None:
    nodes = [pl.NodeInfo(id=n[0], cpu_millicores=n[1], committed_cpu=n[2], memory_mb=4096,
                         schedulable=n[3] if len(n) > 3 else True, runtimes=frozenset({"process"}))
             for n in case["nodes"]]
    placed = [Placed(p[0], p[1], p[2], "process", p[3], 64, p[4] if len(p) > 4 else False,
                     priority=p[5] if len(p) > 5 else 0,
                     moved_at=NOW - p[6] if len(p) > 6 and p[6] is not None else 0.0) for p in case["placed"]]
    got = plan(Rebalance.model_validate(case["spec"]), NOW, nodes, placed,
               [(NOW - ago, w) for ago, w in case.get("moved", [])], case.get("clusterMoves", 0))
    assert [[m.instance, m.source, m.dest, m.held_by] for m in got] == case["expect"], [m.reason for m in got]
    assert all(m.reason for m in got)
