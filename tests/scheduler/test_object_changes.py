"""Which workloads or nodes a mirror change touches (scheduler.object_changes), table-driven from
object_change_cases.yaml; and the per-stream change set: coalescing, reset, wake-ups."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.scheduler.object_changes import WORKLOADS, ChangeSet, touched

CASES: list[dict[str, Any]] = yaml.safe_load((Path(__file__).parent / "object_change_cases.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[f"{c['watched']}-{c['kind']}-{c['id']}" for c in CASES])
def test_touched(case: dict[str, Any]) -> None:
    assert touched(case["watched"], case["kind"], case["id"]) == case["expect"]


async def test_changes_coalesce_and_wake_the_stream() -> None:
    changes = ChangeSet(WORKLOADS)
    waiter = asyncio.create_task(changes.wait(None))
    await asyncio.sleep(0)
    assert not waiter.done()
    for _ in range(100):  # a churning workload is sent once, with its latest view
        changes.listener("status", "web.0")
    changes.listener("workload", "api")
    changes.listener("node", "n1")  # not a workload change
    await asyncio.wait_for(waiter, 5)
    assert changes.take() == (["api", "web"], False)
    changes.listener("reset", "")
    await asyncio.wait_for(changes.wait(None), 5)
    assert changes.take() == ([], True)
    await asyncio.wait_for(changes.wait(0.05), 5)  # nothing pending: returns after the bound
    assert changes.take() == ([], False)
