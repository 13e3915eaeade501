"""Scenario tests, raft style: YAML scripts (tests/scheduler/scenario_cases/*.yaml) drive the
pure step through a world with no store, loop or clock (scenario_world.py). Each script reads
as what happens in a cluster and what must follow: `node n1 Ready`, `apply web replicas=2`,
`report n1 web.0=Running`, `tick 11s`, `expect writes ...`, `expect deliver n1 web.0 web.1`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.scheduler.scenario_world import play

CASES = [c for f in sorted((Path(__file__).parent / "scenario_cases").glob("*.yaml"))
         for c in yaml.safe_load(f.read_text())]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_scenario(case: dict[str, Any]) -> None:
    play(case["script"])
