"""The standby's fast-takeover verdict, table-driven from tests/scheduler/takeover_cases/cases.yaml."""

from __future__ import annotations

import math
from typing import Any

import pytest

from persys.scheduler.ha.takeover import Probe, should_clear
from persys.scheduler.mirror import keys
from persys.store.base import KeyValue
from tests.cases import load

CASES = load(__file__, "takeover_cases/cases.yaml")


def kv(doc: dict[str, Any] | None) -> KeyValue | None:
    if doc is None:
        return None
    return KeyValue(keys.LEADER, str(doc["value"]).encode(), create_revision=doc["rev"], mod_revision=doc["rev"],
                    version=1, lease=0)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_should_clear(case: dict[str, Any]) -> None:
    watched = kv(case["watched"])
    assert watched is not None
    got = should_clear(watched, kv(case["now"]), Probe(case["probe"]), str(case.get("own", "me")).encode(),
                       held_for=float(case.get("held_for", math.inf)), min_hold=float(case.get("min_hold", 0.0)),
                       cooling_down=bool(case.get("cooling_down", False)))
    assert got is case["expect"]
