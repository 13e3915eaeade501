"""The agent's side of the desired-state protocol (persys.agent.decide.merge), table-driven from
tests/agent/merge_cases/*.yaml: generation fencing, hold mode, unreadable specs. Pure: no agent,
no disk. (Against the scheduler's sender: test_delivery_merge_property.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.agent.decide import merge
from persys.agent.decide.plan import Desired

CASE_DIR = Path(__file__).parent / "merge_cases"
CASES = [c for f in sorted(CASE_DIR.glob("*.yaml")) for c in yaml.safe_load(f.read_text())]
BAD = b'{"type": "process", "command": 42, "unknownField": true}'


def spec_json(revision: str) -> bytes:
    if revision == "bad":
        return BAD
    return json.dumps({"type": "process", "process": {"command": ["sleep", revision]}}).encode()


def item(inst: str, doc: str) -> merge.Item:
    revision, generation, *state = doc.split("/")
    return merge.Item(inst, revision, int(generation), state[0] if state else "Running", spec_json(revision))


def desired(inst: str, doc: str) -> Desired:
    parsed = merge.parse(item(inst, doc))
    assert isinstance(parsed, Desired), parsed
    return parsed


def notation(d: Desired) -> str:
    assert d.spec.process is not None and d.spec.process.command == ["sleep", d.revision]
    state = "" if str(d.desired_state) == "Running" else f"/{d.desired_state}"
    return f"{d.revision}/{d.generation}{state}"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_merge_case(case: dict[str, Any]) -> None:
    held = merge.Held({k: desired(k, v) for k, v in (case.get("held") or {}).items()},
                      frozenset(case.get("unreadable", [])))
    msg = case["message"]
    delta = merge.Delta(tuple(item(k, v) for k, v in (msg.get("items") or {}).items()),
                        msg.get("mode", "normal"), msg.get("full", False), tuple(msg.get("removed", [])))
    got = merge.merge(held, delta)
    want = case["expect"]
    assert {k: notation(d) for k, d in got.held.desired.items()} == want["desired"]
    assert sorted(got.held.unreadable) == sorted(want["unreadable"])
    assert sorted(got.changed) == sorted(want["changed"])
    assert sorted(got.removed) == sorted(want["removed"])
    assert got.synced == want["synced"]
    assert got.mode == want.get("mode", "normal")
    if "refused" in want:
        assert sorted(got.refused) == sorted(want["refused"])
    assert set(got.traces) == set(got.changed)
    # The held set is not changed in place (the agent's reconcile pass may be reading it).
    assert {k: notation(d) for k, d in held.desired.items()} == (case.get("held") or {})


def test_restore_keeps_unreadable_records_apart() -> None:
    held, refused = merge.restore([item("a", "r1/3/Stopped"), item("old", "bad/1")])
    assert {k: notation(d) for k, d in held.desired.items()} == {"a": "r1/3/Stopped"}
    assert held.unreadable == {"old"} and set(refused) == {"old"} and refused["old"]
