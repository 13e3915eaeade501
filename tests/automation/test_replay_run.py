"""`policy replay` at its edge (automation/replay_run.py) over an API answering from given
series: what it refuses and why (a 400 naming the field at the gateway), and scale to zero
replayed with the activation workload's history read beside the workload's own (the decisions
themselves: test_replay_agreement.py)."""

from __future__ import annotations

from typing import Any

import pytest

from persys.automation.replay_run import ReplayRefused, replay_policy
from persys.model.automation import Policy, PolicyManifest

NOW = 1_800_000_000.0


def policy(spec: dict[str, Any]) -> Policy:
    m = PolicyManifest.model_validate({"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "p"},
                                       "spec": spec})
    return Policy(name="p", spec=m.spec, created_at=NOW, updated_at=NOW)


class Api:
    def __init__(self, p: Policy, stopped: bool = False) -> None:
        self.p, self.stopped = p, stopped
        self.asked: list[tuple[str, str]] = []

    async def get_automation_policy(self, name: str) -> dict[str, Any]:
        return self.p.view()

    async def get_workload(self, workload_id: str) -> dict[str, Any]:
        return {"name": workload_id, "replicas": 2, "desiredState": "Stopped" if self.stopped else "Running"}

    async def meter_query(self, selector: str, value: str, metric: str, since: float, step: int, agg: str
                          ) -> dict[str, Any]:
        self.asked.append((value, metric))
        load = 40.0 if value == "front" else 0.0
        return {"start": NOW - since, "end": NOW, "series": [
            {"key": value, "points": [[NOW - since + i * step, load] for i in range(int(since // step))]}]}


@pytest.mark.parametrize(("spec", "words"), [
    ({"autoscale": {"workload": "w", "target": 5, "maxReplicas": 3, "metric": "prometheus",
                    "prometheus": {"url": "http://127.0.0.1:9/metrics", "name": "q"}}},
     "Prometheus endpoint of its own: the meter keeps no history of it"),
    ({"remediate": {}}, "is a remediate policy: replay runs autoscale policies"),
    ({"rebalance": {}}, "is a rebalance policy: replay runs autoscale policies"),
])
async def test_refused_naming_why(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(ReplayRefused) as err:
        await replay_policy(Api(policy(spec)), "p", 600, NOW)  # type: ignore[arg-type]
    assert err.value.field == "name" and words in str(err.value), err.value


async def test_scale_to_zero_replays_on_the_activation_workloads_history() -> None:
    p = policy({"autoscale": {"workload": "w", "target": 50, "minReplicas": 0, "maxReplicas": 3, "intervalSeconds": 10,
                              "metricWindowSeconds": 30, "scaleToZero": {"activationThreshold": 5, "idleSeconds": 60,
                                                                         "activationWorkload": "front"}}})
    api = Api(p, stopped=True)
    rep = await replay_policy(api, "p", 600, NOW)  # type: ignore[arg-type]
    assert api.asked == [("w", "cpu"), ("front", "cpu")]
    assert rep["scaleToZero"] and rep["startReplicas"] == 0  # stopped: at zero
    assert rep["activationEvidence"]["value"] == "front"
    # front is busy (40 > 5): the first decision wakes w to one, at its own figure it stays there.
    assert rep["actionList"][0]["from"] == 0 and rep["actionList"][0]["to"] == 1, rep["actionList"]
