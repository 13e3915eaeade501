"""The dashboard's pure figures, table-driven from figures_cases.yaml: the overview's counts and
capacity, the workload and node filters, and the placement table's node-by-node verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from persys.gateway.dashboard import figures
from tests.cases import load

CASES = load(__file__, "figures_cases.yaml")


@pytest.mark.parametrize("case", CASES["overview"], ids=lambda c: c["name"])
def test_overview(case: dict[str, Any]) -> None:
    o = figures.overview(case["nodes"], case["workloads"])
    want = case["expect"]
    assert (o.nodes, o.nodes_by_status, o.workloads, o.workloads_by_phase) == (
        want["nodes"], want["nodes_by_status"], want["workloads"], want["workloads_by_phase"])
    for key in ("cpu", "memory", "disk"):
        cap = getattr(o, key)
        assert [cap.allocatable, cap.requested, cap.used] == want[key], key


@pytest.mark.parametrize("case", CASES["workloads"]["cases"], ids=lambda c: c["name"])
def test_workload_filters(case: dict[str, Any]) -> None:
    def run() -> list[str]:
        return [w["name"] for w in figures.filter_workloads(
            CASES["workloads"]["items"], case.get("label", ""), case.get("type", ""), case.get("phase", ""),
            case.get("node", ""), case.get("q", ""))]

    if "problem" in case:
        with pytest.raises(figures.FilterProblem, match=case["problem"]):
            run()
    else:
        assert run() == case["expect"]


@pytest.mark.parametrize("case", CASES["nodes"]["cases"], ids=lambda c: c["name"])
def test_node_filters(case: dict[str, Any]) -> None:
    got = figures.filter_nodes(CASES["nodes"]["items"], case.get("q", ""), case.get("status", ""),
                               case.get("label", ""))
    assert [n["id"] for n in got] == case["expect"]


@pytest.mark.parametrize("case", CASES["placement"], ids=lambda c: c["name"])
def test_placement_rows(case: dict[str, Any]) -> None:
    rows = figures.node_rejections(case["plan"], case["nodes"])
    assert [r["node"] for r in rows] == [e["node"] for e in case["expect"]]
    for row, want in zip(rows, case["expect"], strict=True):
        assert {k: row.get(k) for k in want} == want


def test_a_long_label_filter_is_refused() -> None:
    with pytest.raises(figures.FilterProblem, match="at most"):
        figures.parse_labels("a" * (figures.MAX_FILTER_CHARS + 1))
