"""The revision history's pure decisions (persys.scheduler.rules.revisions), table-driven from
tests/scheduler/revision_cases/: pruning, the rollback target, and leaving a record out of a
write it would push past the store's request limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from persys.model import Workload, parse_manifests
from persys.model.manifest import ManifestError
from persys.model.revision import WorkloadRevision
from persys.scheduler.mirror import keys
from persys.scheduler.rules import revisions
from persys.store.base import Compare, Delete, Put, txn_bytes
from tests.cases import load

CASES = Path(__file__).parent / "revision_cases"
PRUNING = load(CASES, "pruning.yaml")
ROLLBACK = load(CASES, "rollback.yaml")


@pytest.mark.parametrize("case", PRUNING, ids=[c["name"] for c in PRUNING])
def test_pruning(case: dict[str, Any]) -> None:
    keep = case.get("keep", revisions.KEEP_REVISIONS)
    assert revisions.pruned(case["kept"], case["new"], keep, case.get("fresh", False)) == case["expect"]


@pytest.mark.parametrize("case", ROLLBACK, ids=[c["name"] for c in ROLLBACK])
def test_rollback_target(case: dict[str, Any]) -> None:
    if "refused" in case:
        with pytest.raises(ManifestError) as err:
            revisions.rollback_target("web", case["kept"], case["requested"])
        assert case["refused"] in err.value.problems[0] and err.value.problems[0].startswith("generation: ")
    else:
        assert revisions.rollback_target("web", case["kept"], case["requested"]) == case["expect"]


def _workload(generation: int, command: str = "sleep 60") -> Workload:
    m = parse_manifests(f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: web}}
spec: {{type: process, process: {{command: {json.dumps(command.split())}}}}}
""")[0]
    return Workload.from_manifest(m, 100.0).model_copy(update={"generation": generation})


def test_record_ops_write_the_new_spec_and_prune() -> None:
    w = _workload(11)
    ops = revisions.record_ops(w, set(range(1, 11)), 123.0, rollback_of=4)
    put, *deletes = ops
    assert isinstance(put, Put) and put.key == keys.revision("web", 11) == "/persys/revisions/web/000000000011"
    record = WorkloadRevision.model_validate_json(put.value)
    assert (record.generation, record.revision, record.created_at, record.rollback_of) == (11, w.revision, 123.0, 4)
    assert record.spec == w.spec
    assert deletes == [Delete(keys.revision("web", 1))]
    assert keys.parse_revision(put.key) == ("web", 11) and keys.parse_revision("/persys/revisions/web/x") is None


def test_a_record_that_does_not_fit_is_left_out() -> None:
    w = _workload(2)
    compares = [Compare(keys.workload("web"), 5)]
    ops: list[Put | Delete] = [Put(keys.workload("web"), w.to_json())]
    record = revisions.record_ops(w, {1}, 1.0)
    assert revisions.with_record(compares, ops, record, 1 << 20) == [*ops, *record]
    limit = txn_bytes(compares, [*ops, *record]) - 1
    assert revisions.with_record(compares, ops, record, limit) == ops


def test_history_says_what_each_changed() -> None:
    specs = [_workload(1).spec, _workload(2, "sleep 120").spec, _workload(3).spec]
    records = [WorkloadRevision(workload="web", generation=g, revision=f"r{g}", spec=s, created_at=float(g),
                                rollback_of=1 if g == 3 else None) for g, s in zip((1, 2, 3), specs, strict=True)]
    items = revisions.history(records)
    assert [i["change"] for i in items] == ["created", "command sleep 60 -> sleep 120",
                                            "rollback to 1: command sleep 120 -> sleep 60"]
    assert [i["current"] for i in items] == [False, False, True]
    assert json.loads(json.dumps(items))[0]["spec"]["process"]["command"] == ["sleep", "60"]
    assert revisions.history(records[1:])[0]["change"] == "(earlier revisions pruned)"
