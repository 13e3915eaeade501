"""An image pull as the scheduler records and publishes it (persys.scheduler.mirror.reports): the status
a report calls for and the event kind of each change. Pure."""

from __future__ import annotations

import pytest

from persys.model import Phase, Workload, WorkloadSpec, WorkloadStatus
from persys.scheduler.mirror.follower import Versioned
from persys.scheduler.mirror.reports import WorkloadReport, status_change, status_event

SPEC = WorkloadSpec.model_validate({"type": "container", "container": {"image": "r.example/app:2"}})
WORKLOAD = Workload(id="web", name="web", spec=SPEC, revision="r2", created_at=0, updated_at=0)


def status(phase: Phase, reason: str = "", message: str = "") -> WorkloadStatus:
    return WorkloadStatus(phase=phase, reason=reason, message=message, node_id="n1")


@pytest.mark.parametrize(("prev", "new", "kind"), [
    (status(Phase.SCHEDULED), status(Phase.SCHEDULED, "ImagePulling", "pulling"), "ImagePulling"),
    (status(Phase.SCHEDULED, "ImagePulling", "pulling: 1 MB"), status(Phase.SCHEDULED, "ImagePulling", "pulling: 2 MB"),
     None),  # progress alone updates the status, not the event log
    (status(Phase.SCHEDULED, "ImagePulling"), status(Phase.SCHEDULED, "ImagePulled", "pulled"), "ImagePulled"),
    (status(Phase.SCHEDULED, "ImagePulled"), status(Phase.RUNNING), "WorkloadRunning"),
    (status(Phase.RUNNING), status(Phase.SCHEDULED, "ImagePulling"), "ImagePulling"),  # an update's pull
    (status(Phase.SCHEDULED, "ImagePulling"), status(Phase.FAILED, "RegistryUnauthorized"), "WorkloadFailed"),
    (status(Phase.RUNNING), status(Phase.RUNNING, "", "other"), None),
])
def test_event_kind_of_a_change(prev: WorkloadStatus, new: WorkloadStatus, kind: str | None) -> None:
    assert status_event(prev, new) == kind


@pytest.mark.parametrize(("reason", "want"), [("ImagePulling", "ImagePulling"), ("", "Updating")])
def test_an_update_shows_its_pull_while_the_old_revision_runs(reason: str, want: str) -> None:
    report = WorkloadReport("web", "r1", 1, Phase.RUNNING, reason=reason, message="pulling r.example/app:2")
    change = status_change(Versioned(status(Phase.RUNNING), 7), Versioned(WORKLOAD, 3), "n1", report, 10.0)
    assert change is not None
    _, _, _, new = change
    assert (new.phase, new.reason, new.message) == (Phase.SCHEDULED, want, "pulling r.example/app:2")
