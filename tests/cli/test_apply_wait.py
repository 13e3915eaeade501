"""`persysctl apply --wait`'s decision per workload view (persys.cli.ctl.apply_wait.verdict), table-driven
from wait_cases.yaml. The waiting itself runs against a real cluster in tests/gateway/test_logs_follow.py."""

from __future__ import annotations

from typing import Any

import pytest

from persys.cli.ctl.apply_wait import verdict
from tests.cases import load

CASES = load(__file__, "wait_cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_verdict(case: dict[str, Any]) -> None:
    v = verdict(case["view"])
    assert v.state == case["want"]["state"]
    assert case["want"].get("detail", "") in v.detail


def test_running_counts_once_it_held_without_a_restart() -> None:
    """A crash loop is Running between its exits: `--wait` waits for the settling time with the
    restart count unchanged, and says how often it restarted meanwhile."""
    from persys.cli.ctl.apply_wait import Settling, Verdict

    running, failed = Verdict("running", "Running, 1/1 ready"), Verdict("waiting", "Failed (Exited): exit code 1")
    s = Settling(settle=2.0)
    assert s.observe(running, 0, 10.0).state == "waiting"
    assert s.observe(failed, 1, 10.5).detail.endswith("restarted 1 time(s) while waiting")
    assert s.observe(running, 1, 11.0).state == "waiting"  # running again: the clock starts over
    assert s.observe(running, 2, 12.5).state == "waiting"  # restarted between two polls
    assert s.observe(running, 2, 14.0).state == "waiting"
    assert s.observe(running, 2, 14.5) == running  # held 2 s at 2 restarts
    stable = Settling(settle=2.0)
    assert stable.observe(running, 3, 0.0).state == "waiting"  # restarts before the wait do not matter
    assert stable.observe(running, 3, 2.0) == running
    assert Settling(settle=0).observe(running, 0, 0.0) == running
