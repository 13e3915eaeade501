"""The pure parts of following a workload's logs on its page (log_follow.py), table-driven."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.gateway.dashboard.log_follow import MAX_LINE, RESUME_MARGIN, LineBuffer, seconds_of, split_stamped

CASES = yaml.safe_load((Path(__file__).parent / "log_follow_cases.yaml").read_text())


@pytest.mark.parametrize("case", CASES["stamped"], ids=lambda c: c["line"][:40])
def test_split_stamped(case: dict[str, Any]) -> None:
    assert list(split_stamped(case["line"])) == case["want"]


@pytest.mark.parametrize("case", CASES["pieces"], ids=lambda c: repr(c["pieces"])[:40])
def test_line_buffer(case: dict[str, Any]) -> None:
    buf = LineBuffer()
    assert [[list(x) for x in buf.feed(p)] for p in case["pieces"]] == case["want"]


def test_bounds_and_since() -> None:
    assert len(split_stamped("x" * (MAX_LINE * 2))[1]) == MAX_LINE  # a long line is cut
    assert LineBuffer().feed("y" * (MAX_LINE * 5)) != []  # a line that never ends is shown in pieces
    assert seconds_of("") == 0.0
    assert abs(seconds_of("1970-01-01T00:00:10.500000000Z") - (10.5 - RESUME_MARGIN)) < 1e-6  # the browser aligns
    assert seconds_of("1970-01-01T00:00:01.000000000Z") == 0.0
