"""Table-driven scenarios: every ``scenarios/*.yaml`` case is one test.

Case format (see scenarios/*.yaml): ``nodes``, optional ``config``, and ``workloads`` placed in
order with ``place_many`` (each success reserves capacity). Each workload may carry ``expect``:
``node`` (id or null = pending), ``feasible``, ``reasons`` {node: substring}, ``codes``
{node: code}, ``explain`` (exact), ``explain_contains`` [substrings], ``top`` [node ids in order],
``every_reason`` {node: [code, ...]} (a pending decision's every failing filter of that node, in
filter order; exactly the detailed nodes when given), ``detailed`` (exact `explain_detailed()`),
``detailed_contains`` [substrings], ``devices`` [ids given to the placement].
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from placement_helpers import config_from_data, node_from_data, request_from_data

from persys.scheduler.placement import Decision, Reservations, Snapshot, place_many

SCENARIO_DIR = Path(__file__).parent / "scenarios"


def _cases() -> list[Any]:
    params = []
    for path in sorted(SCENARIO_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for case in doc["cases"]:
            params.append(pytest.param(case, id=f"{path.stem}:{case['name']}"))
    return params


def check_every_reason(expect: dict[str, Any], decision: Decision) -> None:
    where = decision.explain_detailed()
    if "every_reason" in expect:
        got = {node_id: [st.code for st in statuses] for node_id, statuses in decision.reasons.items()}
        assert got == expect["every_reason"], where
    if "detailed" in expect:
        assert where == expect["detailed"]
    for text in expect.get("detailed_contains", []):
        assert text in where, where


@pytest.mark.parametrize("case", _cases())
def test_scenario(case: dict[str, Any]) -> None:
    snapshot = Snapshot(tuple(node_from_data(n) for n in case["nodes"]))
    requests = [request_from_data(w) for w in case["workloads"]]
    ledger = Reservations()
    decisions = place_many(snapshot, requests, ledger, config_from_data(case.get("config")))
    for wl, decision in zip(case["workloads"], decisions, strict=True):
        expect = wl.get("expect")
        if not expect:
            continue
        _check_expected(expect, decision, f"{wl['id']}: {decision.explain()}")
    placed = sum(d.placed for d in decisions)
    assert len(ledger) == placed


def _check_expected(expect: dict[str, Any], decision: Any, where: str) -> None:
    """One workload's decision against its case's `expect`."""
    if "node" in expect:
        assert decision.node_id == expect["node"], where
    if "feasible" in expect:
        assert decision.feasible == expect["feasible"], where
    for node_id, text in expect.get("reasons", {}).items():
        assert node_id in decision.rejections, where
        assert text in decision.rejections[node_id].message, where
    for node_id, code in expect.get("codes", {}).items():
        assert decision.rejections[node_id].code == code, where
    if "explain" in expect:
        assert decision.explain() == expect["explain"]
    for text in expect.get("explain_contains", []):
        assert text in decision.explain(), where
    check_every_reason(expect, decision)
    if "top" in expect:
        assert [s.node_id for s in decision.scores] == expect["top"], where
    if "devices" in expect:
        assert list(decision.devices) == expect["devices"], where
    json.dumps(decision.to_dict())  # always JSON-serialisable
