"""Rightsizing (pure): the target covers the p90 within 15 %, memory never below its peak,
the backtest is a replay, short history widens the bounds and lowers the confidence."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from persys.intelligence.rightsize import DecayingHistogram, backtest, recommend

NOW = 1_800_000_000.0


def varying_cpu(n: int, step: float, seed: int) -> list[tuple[float, float]]:
    """Percent of a core: a slow sine between 20 % and 80 % plus noise and rare bursts."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        v = 50 + 30 * math.sin(i / 17) + rng.gauss(0, 5) + (60 if rng.random() < 0.03 else 0)
        out.append((NOW - (n - i) * step, max(v, 0.5)))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_cpu_target_covers_the_p90_within_15_percent(seed: int) -> None:
    pts = varying_cpu(360, 10.0, seed)  # an hour at 10 s
    r = recommend("w", pts, [], NOW, 2000, 0)
    assert r.cpu is not None
    p90 = float(np.percentile([v * 10 for _, v in pts], 90))
    assert p90 <= r.cpu.target <= 1.15 * p90, (p90, r.cpu.target)
    # The backtest is a replay: samples above the request, counted again here.
    milli = [v * 10 for _, v in pts]
    assert r.cpu.backtest_target.over == sum(1 for m in milli if m > r.cpu.target)
    assert r.cpu.backtest_current.over == sum(1 for m in milli if m > 2000)
    assert r.cpu.backtest_target.over <= 0.1 * len(milli)


def test_memory_is_never_below_the_peak_and_an_oom_kill_raises_it() -> None:
    mem = [(NOW - 3600 + i * 60, 100e6 + (i % 7) * 1e6) for i in range(60)] + [(NOW - 10, 180e6)]
    r = recommend("w", [], mem, NOW, 0, 150)
    assert r.memory is not None
    assert r.memory.target >= 180e6 * 1.15 and r.memory.lower >= 180e6
    assert r.memory.backtest_target.over == 0
    assert r.memory.backtest_current.over == 1  # the 180 MB sample over a 150 MiB request: killed
    bumped = recommend("w", [], [(NOW - 60, 10e6)], NOW, 0, 150, oom_kills=1)
    assert bumped.memory is not None and bumped.memory.target >= 150 * 2**20 + 100 * 2**20


def test_short_history_widens_the_bounds_and_lowers_the_confidence() -> None:
    hour = recommend("w", varying_cpu(360, 10.0, 1), [], NOW, 1000, 0)
    week = recommend("w", varying_cpu(8 * 24 * 60, 60.0, 1), [], NOW, 1000, 0)
    assert hour.cpu is not None and week.cpu is not None
    assert hour.confidence < 0.01 and hour.to_dict()["confidenceText"] == "low"
    assert week.confidence == pytest.approx(1.0, abs=0.01) and week.to_dict()["confidenceText"] == "high"
    assert hour.cpu.upper / hour.cpu.target > 10 > week.cpu.upper / week.cpu.target


def test_a_capped_workload_is_not_shrunk_to_its_cap() -> None:
    capped = [(NOW - i * 10, 49.9) for i in range(100)]  # at a 500m limit all the time
    r = recommend("w", capped, [], NOW, 500, 0)
    assert r.cpu is not None and r.cpu.target >= 600 and r.cpu.notes


def test_no_samples_no_recommendation() -> None:
    r = recommend("w", [], [], NOW, 100, 64)
    assert r.cpu is None and r.memory is None and r.notes and r.to_dict()["cpu"] is None


def test_the_histogram_decays_old_samples() -> None:
    h = DecayingHistogram()
    for _ in range(100):
        h.add(1000, age=10 * 86400)  # ten days old: weight 2^-10 each
    for _ in range(10):
        h.add(100, age=0)
    assert h.percentile(0.5) < 110
    assert backtest([1, 2, 3], 2).over == 1


@pytest.mark.parametrize("n", [2, 5, 24, 360])
def test_the_weighted_percentile_is_numpys_with_equal_weights(n: int) -> None:
    from persys.intelligence.rightsize import weighted_percentile

    rng = random.Random(n)
    values = [rng.uniform(0, 1000) for _ in range(n)]
    assert weighted_percentile(values, [1.0] * n, 0.9) == pytest.approx(float(np.percentile(values, 90)))
