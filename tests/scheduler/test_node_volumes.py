"""The node's part in volumes, pure (tables in volume_cases/node_steps.yaml): the steps a node is
handed for its local volumes, what its results write, and the attachment records its reports
keep."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model.volume import Volume, VolumeAttachment, VolumeManifest, VolumeObjectSpec
from persys.scheduler.api.node_volumes import Attached, TaskResult, VolumeReport, attachment_changes, result_action
from persys.scheduler.api.volumes import VolumeApi
from persys.scheduler.mirror.follower import Versioned
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.rules.volume_steps import actions
from tests.cases import load
from tests.scheduler.test_core import node
from tests.scheduler.test_node_ops import s, until_event  # noqa: F401  (s: the scheduler fixture)

CASES = load(__file__, "volume_cases/node_steps.yaml")


def record(name: str, fields: dict[str, Any]) -> Versioned[Volume]:
    fields = dict(fields)
    spec = VolumeObjectSpec.model_validate({"driver": fields.pop("driver", "local"), "sizeMb": fields.pop("sizeMb", 8)})
    doc = {"id": name, "spec": spec.to_doc(), "createdAt": 0, "updatedAt": 0, **fields}
    return Versioned(Volume.model_validate(doc), 7)


@pytest.mark.parametrize("case", CASES["steps"], ids=[c["name"] for c in CASES["steps"]])
def test_steps(case: dict[str, Any]) -> None:
    vols = {k: record(k, v) for k, v in case["volumes"].items()}
    drivers = ("local",) if case["node"] else ("nfs", "ceph-rbd")
    got = [[a.kind, a.volume.id, a.snapshot] for a in actions(vols, drivers, {}, 0.0, node=case["node"])]
    assert got == case["want"]


@pytest.mark.parametrize("case", CASES["results"], ids=[c["name"] for c in CASES["results"]])
def test_results(case: dict[str, Any]) -> None:
    cur = record("vol", case["volume"])
    r = case["result"]
    found = result_action("n1", TaskResult("vol", r["op"], r.get("snapshot", ""), r["ok"], r.get("reason", ""),
                                           r.get("sizeMb", 0), tuple(r.get("snapshots", ()))), cur)
    if case["write"] == "none":
        assert found is None
        return
    assert found is not None
    step, outcome = found
    assert step.mod_revision == 7  # written over the record it was decided on
    if case["write"] == "unchanged":
        assert outcome is None
        return
    assert outcome is not None and outcome.event == case["event"]
    if case["write"] == "delete":
        assert outcome.volume is None
        return
    assert outcome.volume is not None
    doc = outcome.volume.to_doc()
    assert {k: doc.get(k, [] if k == "snapshots" else 0) for k in case["write"]} == case["write"]


@pytest.mark.parametrize("case", CASES["attachments"], ids=[c["name"] for c in CASES["attachments"]])
def test_attachment_records(case: dict[str, Any]) -> None:
    vols = {k: record(k, {"driver": d, "node": "n1" if d == "local" else ""}) for k, d in case["volumes"].items()}
    current = {k: VolumeAttachment(volume=k, node="n1", driver="local", since=1.0, **v)
               for k, v in case["current"].items()}
    reported = [Attached(a["volume"], a["driver"], a["kind"], False, tuple(a["instances"])) for a in case["reported"]]
    puts, gone = attachment_changes("n1", current, reported, vols, now=100.0)
    assert [[p.volume, p.kind, p.instances, p.since] for p in puts] == case["put"]
    assert all(p.node == "n1" for p in puts)
    assert gone == case["gone"]


# --- on a scheduler (embedded store): the records a node's reports keep, the steps it is handed --

def _volume_manifest(name: str, node_id: str) -> VolumeManifest:
    return VolumeManifest.model_validate({"apiVersion": "persys.dev/v1", "kind": "Volume", "metadata": {"name": name},
                                          "spec": {"driver": "local", "sizeMb": 8, "node": node_id}})


async def test_reports_keep_attachment_records_and_steps_follow_the_record(s: Scheduler) -> None:  # noqa: F811
    api = VolumeApi(s)
    await s.agent_api.register(node("n1"))
    await api.apply(_volume_manifest("pg", "n1"))
    held = Attached("pg", "local", "filesystem", False, ("db",), size_mb=8)
    await s.agent_api.report("n1", [], False, VolumeReport((held,), True, ()))
    view = api.get("pg")
    assert view["phase"] == "Available" and view["provisionedMb"] == 8  # provisioned at first attach
    assert [(a["node"], a["kind"], a["instances"]) for a in view["attachments"]] == [("n1", "filesystem", ["db"])]
    # Detached: the record goes.
    await s.agent_api.report("n1", [], False, VolumeReport((), True, ()))
    assert api.get("pg")["attachments"] == [] and "n1" not in s.state.attachments
    # Deleting: the node is handed the delete until its result is in; then the record is gone.
    await api.delete("pg")
    assert [(t.volume_id, t.op) for t in s.node_volumes.tasks("n1")] == [("pg", "delete")]
    assert s.node_volumes.tasks("n2") == []
    await s.agent_api.report("n1", [], False, VolumeReport((), True, (TaskResult("pg", "delete", "", True),)))
    assert "pg" not in s.state.volumes and s.node_volumes.tasks("n1") == []
    await until_event(s, "VolumeDeleted")


async def test_a_deleted_node_takes_its_attachment_records_and_orphans_its_local_volumes(
        s: Scheduler) -> None:  # noqa: F811
    api = VolumeApi(s)
    await s.agent_api.register(node("n1"))
    await api.apply(_volume_manifest("pg", "n1"))
    attached = VolumeReport((Attached("pg", "local", "filesystem", False, ()),), True, ())
    await s.agent_api.report("n1", [], False, attached)
    assert "pg" in s.state.attachments["n1"]
    await s.node_api.delete_node("n1")
    assert "n1" not in s.state.attachments and api.get("pg")["attachments"] == []
    # Nobody can remove its data now: deleting it removes the record at once.
    assert await api.delete("pg") == (True, False)
    assert "pg" not in s.state.volumes
