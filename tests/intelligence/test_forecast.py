"""Forecasts (pure): on series with a known daily season and trend the backtested MASE is under
1 and the 80 % interval covers 70-90 % of held-out points; white noise is "unpredictable"."""

from __future__ import annotations

import numpy as np
import pytest

from persys.intelligence.forecast import ForecastError, forecast

STEP = 300.0
N = 14 * 288  # two weeks at five minutes


def seasonal(seed: int, noise: float = 3.0) -> list[tuple[float, float]]:
    rng = np.random.default_rng(seed)
    t = np.arange(N) * STEP
    y = 50 + 0.002 * np.arange(N) + 20 * np.sin(2 * np.pi * t / 86400) + rng.normal(0, noise, N)
    return list(zip(t.tolist(), y.tolist(), strict=True))


@pytest.mark.parametrize("seed", range(8))
def test_seasonal_series_with_trend_is_forecast(seed: int) -> None:
    f = forecast(seasonal(seed), STEP, 86400)
    assert f.mase is not None and f.mase < 1, f.to_dict()
    assert f.coverage is not None and 0.70 <= f.coverage <= 0.90, f.coverage
    assert not f.unpredictable and f.to_dict()["verdict"] == "forecast"
    assert len(f.point) == 288 and all(lo <= p <= hi for p, lo, hi in zip(f.point, f.lower, f.upper, strict=True))
    # The forecast follows the season: a day ahead looks like the last day, shifted by the trend.
    assert 0.8 < (max(f.point) - min(f.point)) / 40 < 1.4


@pytest.mark.parametrize("seed", range(8))
def test_white_noise_is_unpredictable(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    pts = list(zip((np.arange(N) * STEP).tolist(), rng.normal(50, 5, N).tolist(), strict=True))
    f = forecast(pts, STEP, 86400)
    assert f.unpredictable and f.to_dict()["verdict"] == "unpredictable", f.to_dict()


def test_short_history_fits_no_season_and_says_so() -> None:
    pts = [(i * 60.0, 10 + 0.1 * i) for i in range(120)]  # two hours at a minute, a clean trend
    f = forecast(pts, 60, 600)
    assert "no daily season" in " ".join(f.notes) and f.model.startswith("Holt linear")
    assert f.point[-1] == pytest.approx(10 + 0.1 * 129, rel=0.01)


def test_too_little_history_is_refused() -> None:
    with pytest.raises(ForecastError, match="too few"):
        forecast([(0, 1), (60, 2)], 60, 600)


def test_a_predictable_forecast_crossing_capacity_is_an_insight_an_unpredictable_one_is_not() -> None:
    from persys.intelligence.insights import capacity_recommendation

    f = forecast(seasonal(1), STEP, 86400)  # peaks near 50 + 0.002 * 4300 + 20 = 78.6
    answer = {"metric": "cpu", "unit": "percent of one core", "step": STEP,
              "evidence": ["meter:node/n1/cpu/avg/300s@0-1"], **f.to_dict()}
    rec = capacity_recommendation(answer, 75.0)
    assert rec is not None and rec["kind"] == "capacity" and 0 < rec["detail"]["hours"] <= 24 and rec["evidence"]
    assert capacity_recommendation(answer, 500.0) is None
    assert capacity_recommendation({**answer, "unpredictable": True}, 75.0) is None
