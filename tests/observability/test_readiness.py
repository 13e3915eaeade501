"""/readyz's verdict (observability.health_checks.readiness), table-driven from readiness_cases.yaml;
and the dependency checks' bounds: a check that raises or hangs is "not ok" with the reason."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from persys.observability.health_checks import CheckResult, NamedCheck, readiness, run_checks
from tests.cases import load

CASES: list[dict[str, Any]] = load(__file__, "readiness_cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_readiness(case: dict[str, Any]) -> None:
    verdict = readiness(case["health"], case.get("error", ""))
    assert (verdict.ready, verdict.reason) == (case["expect"]["ready"], case["expect"]["reason"])
    assert case["expect"].get("detail", "") in verdict.detail


async def test_checks_run_together_each_bounded() -> None:
    async def fine() -> CheckResult:
        return CheckResult(True, "3 secret(s)")

    async def broken() -> CheckResult:
        raise ConnectionError("meter store at /var/lib/persys/meter.duckdb: locked")

    async def hangs() -> CheckResult:
        await asyncio.sleep(60)
        return CheckResult(True)

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    states = await run_checks([NamedCheck("secret-store", fine), NamedCheck("meter", broken),
                               NamedCheck("slow", hangs)], seconds=0.3)
    assert loop.time() - t0 < 5  # concurrently, each cut at its bound
    assert [(s.name, s.ok) for s in states] == [("secret-store", True), ("meter", False), ("slow", False)]
    assert states[1].reason == "ConnectionError: meter store at /var/lib/persys/meter.duckdb: locked"
    assert states[2].reason == "no answer in 0.3 s"
