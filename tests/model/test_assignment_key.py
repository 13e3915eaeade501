"""Assignment.instance_id keeps its stored key: documents written before the rename (and by
replicas of the previous version) say workloadId, and what is written still does."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from persys.model import Assignment

DOC = {"nodeId": "n1", "revision": "r1", "generation": 2, "desiredState": "Running"}


def test_stored_under_workload_id_and_read_back() -> None:
    a = Assignment(instance_id="web.1", node_id="n1", revision="r1", generation=2, desired_state="Running")
    stored = json.loads(a.to_json())
    assert stored["workloadId"] == "web.1" and "instanceId" not in stored
    assert Assignment.model_validate_json(a.to_json()) == a


@pytest.mark.parametrize("key", ["workloadId", "instanceId", "instance_id"])
def test_read_under_either_key(key: str) -> None:
    assert Assignment.model_validate({key: "web.1", **DOC}).instance_id == "web.1"


def test_the_old_python_name_is_refused() -> None:
    with pytest.raises(ValidationError):
        Assignment.model_validate({"workload_id": "web.1", **DOC})
