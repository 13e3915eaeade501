"""Pure: how the loop turns scale to zero into a workload manifest (zero is the workload stopped at
one replica: Persys workloads have at least one) and back, and reads a stopped workload as zero."""

from __future__ import annotations

from persys.automation.loop import current_replicas, fresh_total, scaled_manifest
from persys.automation.observe import WindowFigure

WORKLOAD = {"name": "web", "labels": {"a": "b"}, "replicas": 3, "desiredState": "Running",
            "spec": {"type": "process", "replicas": 3, "process": {"command": ["sleep", "9"]}}}


def test_zero_is_stopped_at_one_replica_and_back() -> None:
    down = scaled_manifest(WORKLOAD, 0, to_zero=True)
    assert (down["spec"]["replicas"], down["spec"]["desiredState"]) == (1, "Stopped")
    up = scaled_manifest({**WORKLOAD, "desiredState": "Stopped"}, 2, to_zero=True)
    assert (up["spec"]["replicas"], up["spec"]["desiredState"]) == (2, "Running")
    plain = scaled_manifest(WORKLOAD, 2)
    assert plain["spec"]["replicas"] == 2 and "desiredState" not in plain["spec"]
    assert plain["metadata"] == {"name": "web", "labels": {"a": "b"}}


def test_a_stopped_workload_is_at_zero_only_for_scale_to_zero() -> None:
    stopped = {**WORKLOAD, "desiredState": "Stopped", "replicas": 1}
    assert current_replicas(stopped, to_zero=True) == 0
    assert current_replicas(stopped, to_zero=False) == 1
    assert current_replicas(WORKLOAD, to_zero=True) == 3


def test_an_activation_figure_is_used_only_while_fresh() -> None:
    assert fresh_total(WindowFigure(12.0, 990.0, 1), 1000.0, 60) == 12.0
    assert fresh_total(WindowFigure(12.0, 900.0, 1), 1000.0, 60) is None
    assert fresh_total(WindowFigure(None, None, 0), 1000.0, 60) is None
