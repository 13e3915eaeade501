"""`persysctl apply --wait`'s decision per workload view (persys.cli.apply_wait.verdict), table-driven
from wait_cases.yaml. The waiting itself runs against a real cluster in tests/gateway/test_logs_follow.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.cli.apply_wait import verdict

CASES = yaml.safe_load((Path(__file__).parent / "wait_cases.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_verdict(case: dict[str, Any]) -> None:
    v = verdict(case["view"])
    assert v.state == case["want"]["state"]
    assert case["want"].get("detail", "") in v.detail
