"""persysctl exec's pure parts on the agent: cases in exec_cases/exec.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.agent.runtimes.compose.project import choose_service
from persys.agent.runtimes.exec_output import OutputBuffer, exit_status
from tests.cases import load

CASES = load(__file__, "exec_cases/exec.yaml")


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in cases]


@pytest.mark.parametrize("case", CASES["service"], ids=_ids(CASES["service"]))
def test_service(case: dict[str, Any]) -> None:
    if "problem" in case:
        with pytest.raises(ValueError) as err:
            choose_service(case["services"], case["asked"])
        assert str(err.value) == case["problem"]
        return
    assert choose_service(case["services"], case["asked"]) == case["want"]


@pytest.mark.parametrize("case", CASES["output"], ids=_ids(CASES["output"]))
def test_output(case: dict[str, Any]) -> None:
    buf = OutputBuffer(cap=case["cap"])
    for stream, text in case["chunks"]:
        buf.add(stream, text.encode())
    got = buf.result(0, timed_out=False, target="")
    assert {"stdout": got.stdout.decode(), "stderr": got.stderr.decode(), "truncated": got.truncated} == case["want"]


@pytest.mark.parametrize("case", CASES["status"], ids=_ids(CASES["status"]))
def test_status(case: dict[str, Any]) -> None:
    assert exit_status(case["returncode"]) == case["want"]
