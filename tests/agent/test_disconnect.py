"""The disconnection decision and the Stop/Keep defaults, table-driven from tests/agent/disconnect_cases/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.agent.decide.disconnect import AckClock, Snapshot, decide, heartbeat_interval, stop_after
from persys.model import OnDisconnect, Workload
from persys.model.manifest import ManifestError, validate_manifest
from tests.cases import load as load_cases

CASES = Path(__file__).parent / "disconnect_cases"


def load(name: str) -> list[dict[str, Any]]:
    return load_cases(CASES, name)  # type: ignore[no-any-return]


DECIDE, HEARTBEAT, POLICY = load("decide.yaml"), load("heartbeat.yaml"), load("policy.yaml")


@pytest.mark.parametrize("case", DECIDE, ids=[c["name"] for c in DECIDE])
def test_decide(case: dict[str, Any]) -> None:
    v = decide(Snapshot(
        now=case["now"], started_at=case.get("started_at", 0.0), last_ack=case.get("last_ack"),
        last_full_set=case.get("last_full_set"), grace=case.get("grace", 10.0),
        heartbeat_interval=case.get("heartbeat", 3.0),
        policies={w: OnDisconnect(p) for w, p in case["policies"].items()}, fenced=case.get("fenced", {})))
    got = {"silent_for": v.silent_for, "stop_after": v.stop_after, "disconnected": v.disconnected,
           "fence": list(v.fence), "release": list(v.release), "next_check": v.next_check,
           "resync": v.resync}
    for key, want in case["expect"].items():
        numeric = isinstance(want, (int, float)) and not isinstance(want, bool)
        assert got[key] == (pytest.approx(want) if numeric else want), key


@pytest.mark.parametrize("case", HEARTBEAT, ids=[c["name"] for c in HEARTBEAT])
def test_heartbeat_interval(case: dict[str, Any]) -> None:
    interval = heartbeat_interval(case["told"], case["grace"])
    assert interval == pytest.approx(case["interval"])
    assert stop_after(case["grace"], interval) == pytest.approx(case["stop_after"])


def _manifest(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "w"},
            "spec": {"type": "process", "process": {"command": ["sleep", "1"]}, **spec}}


@pytest.mark.parametrize("case", POLICY, ids=[c["name"] for c in POLICY])
def test_policy(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(ManifestError) as err:
            validate_manifest(_manifest(case["spec"]))
        assert any(p.startswith(case["error"] + ":") for p in err.value.problems), err.value.problems
        return
    m = validate_manifest(_manifest(case["spec"]))
    assert m.spec.disconnect_policy() == OnDisconnect(case["expect"])


def test_unset_policy_and_access_mode_leave_existing_revisions_alone() -> None:
    # Workloads stored before these fields existed must not all be replaced on upgrade.
    m = validate_manifest(_manifest({"volumes": [{"name": "data", "mountPath": "/data"}]}))
    doc = m.spec.to_doc()
    assert "onDisconnect" not in doc and "accessMode" not in doc["volumes"][0]  # type: ignore[index]
    explicit = validate_manifest(_manifest({"onDisconnect": "Stop",
                                            "volumes": [{"name": "data", "mountPath": "/data"}]}))
    assert Workload.revision_of(m.spec, 0) != Workload.revision_of(explicit.spec, 0)


def test_ack_clock_pairs_answers_with_send_times_in_order() -> None:
    c = AckClock()
    c.sent(1.0)
    c.sent(4.0)
    c.answered(True)
    assert c.last_ack == 1.0
    c.sent(7.0)
    c.unsent()  # never left: the next answer belongs to the heartbeat sent at 4
    c.answered(False)  # a `reregister` answer is no contact
    assert c.last_ack == 1.0
    c.sent(10.0)
    c.reset()  # the stream ended: its answers will not come
    c.answered(True)
    assert c.last_ack == 1.0
    c.contact(12.0)
    c.contact(11.0)  # a slower call answered later does not move contact back
    assert c.last_ack == 12.0
