"""Table-driven what-if plans and counterfactuals: every ``whatif_cases/*.yaml`` case is one test.

Operation cases: ``nodes``, ``running`` (requests with their ``node``, and ``stays`` when they
cannot move; they count in their node's figures), ``pending``, ``operation`` ({kind, nodes, label,
add}) and ``expect``: ``affected`` [ids], ``moves`` {instance: node}, ``pending`` {instance:
substring of its explanation}, ``stays`` {instance: substring}, ``placed`` {instance: node},
``still_pending`` [ids], ``error`` (substring of the ValueError). Counterfactual cases: ``workload``
instead of ``operation``, expect ``changes`` [summaries, in rank order] (exact) or
``changes_contain``, ``kinds`` [kinds in order], ``none`` (no change found). Preemption cases:
``preempt`` (the Pending request), expect ``node`` and ``victims`` [ids], or ``none``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from placement_helpers import config_from_data, node_from_data, request_from_data
from whatif_helpers import cluster_from_data

from persys.scheduler.placement import Operation, counterfactuals, decide, plan_operation, preemption
from tests.cases import load

CASES = Path(__file__).parent / "whatif_cases"


def _cases() -> list[Any]:
    params = []
    for path in sorted(CASES.glob("*.yaml")):
        for case in load(path)["cases"]:
            params.append(pytest.param(case, id=f"{path.stem}:{case['name']}"))
    return params


def _operation(data: dict[str, Any]) -> Operation:
    label = data.get("label")
    return Operation(data["kind"], nodes=tuple(data.get("nodes", ())),
                     label=tuple(label.split("=", 1)) if label else None,  # type: ignore[arg-type]
                     add=tuple(node_from_data(n) for n in data.get("add", ())))


def check_preemption(cluster: Any, case: dict[str, Any], config: Any) -> None:
    expect = case["expect"]
    pre = preemption(cluster, request_from_data(case["preempt"]), config)
    if expect.get("none"):
        assert pre is None, pre
        return
    assert pre is not None and pre.node_id == expect["node"], pre
    assert [v.request.id for v in pre.victims] == expect["victims"]
    assert pre.decision.node_id == expect["node"]


def check_counterfactuals(cluster: Any, case: dict[str, Any], config: Any) -> None:
    expect = case["expect"]
    request = request_from_data(case["workload"])
    found = counterfactuals(cluster, request, config)
    summaries = [c.summary for c in found.changes]
    where = json.dumps(found.to_dict(), indent=1)
    if "changes" in expect:
        assert summaries == expect["changes"], where
    for text in expect.get("changes_contain", []):
        assert text in summaries, where
    if "kinds" in expect:
        assert [c.kind for c in found.changes] == expect["kinds"], where
    if expect.get("none"):
        assert found.changes == (), where
    for change in found.changes:  # every change was verified: its own figures say it fits
        assert change.fits >= 1 and change.lands_on, where
    assert decide(cluster.snapshot, request, config).node_id == found.decision.node_id


@pytest.mark.parametrize("case", _cases())
def test_whatif_case(case: dict[str, Any]) -> None:
    cluster = cluster_from_data(case)
    config = config_from_data(case.get("config"))
    expect = case["expect"]
    if "operation" in case:
        before = list(cluster.snapshot.effective)
        if "error" in expect:
            with pytest.raises(ValueError, match=expect["error"]):
                plan_operation(cluster, _operation(case["operation"]), config)
            return
        plan = plan_operation(cluster, _operation(case["operation"]), config)
        where = json.dumps(plan.to_dict(), indent=1)
        assert list(cluster.snapshot.effective) == before  # pure: the snapshot given is left as it was
        if "affected" in expect:
            assert list(plan.affected_nodes) == expect["affected"], where
        assert {o.instance: o.to_node for o in plan.moves} == expect.get("moves", {}), where
        assert {o.instance for o in plan.stranded} == set(expect.get("pending", {})), where
        for inst, text in expect.get("pending", {}).items():
            assert text in next(o for o in plan.stranded if o.instance == inst).decision.explain_detailed(), where
        assert {s.instance for s in plan.stays} == set(expect.get("stays", {})), where
        for inst, text in expect.get("stays", {}).items():
            assert text in next(s for s in plan.stays if s.instance == inst).reason, where
        assert {o.instance: o.to_node for o in plan.newly_placed} == expect.get("placed", {}), where
        assert [o.instance for o in plan.still_pending] == expect.get("still_pending", []), where
        if "summary" in expect:
            assert plan.summary == expect["summary"]
        return
    if "preempt" in case:
        check_preemption(cluster, case, config)
        return
    check_counterfactuals(cluster, case, config)
