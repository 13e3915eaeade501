"""Rightsizing: CPU and memory requests for a workload from its meter history. Pure.

After the Kubernetes VPA recommender (docs/intelligence.md, "Rightsizing"):

* **CPU**: the decaying p90 of the CPU samples (each weighted 2^(-age / 24 h), VPA's half-life;
  interpolated between samples, on the samples themselves rather than bucketed: a query holds at
  most a few thousand) plus a 10 % margin. CPU is compressible (too little throttles, never
  kills): a smaller margin than VPA's 15 % keeps the target within 15 % above the p90.
* **Memory**: never below the highest sample seen (memory is not compressible: too little is an
  OOM kill): the larger of the peak and the decaying p95 of the per-day peaks, plus 15 %; after an
  OOM kill at least 20 % (or 100 MiB) more than the request it died at.
* **Short history widens the bounds**: confidence = min(1, history / 8 days); the bounds are
  target x (1 + 0.001/days)^-2 ... target x (1 + 1/days) with days = max(history, 1 minute) in
  days, VPA's confidence multipliers: an hour of history gives an upper bound 25x the target, a
  week 1.14x; the target is shown with that range and the confidence, never alone.
* **Capped**: when the current CPU request is also the limit and over 5 % of the samples sit at it,
  demand above it is invisible: the target is then at least the request + 20 %.
* **Backtest**: each candidate request replayed over the samples: CPU samples above it (they
  would have been throttled), memory samples above it (they would have been killed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

HALF_LIFE = 24 * 3600.0
BUCKET_RATIO = 1.01
CPU_MARGIN = 0.10
MEMORY_MARGIN = 0.15
FULL_HISTORY = 8 * 24 * 3600.0
CAPPED_SHARE = 0.05
OOM_BUMP, OOM_MIN_BYTES = 0.20, 100 * 2**20
MIN_CPU_MILLI, MIN_MEMORY = 10, 16 * 2**20


class DecayingHistogram:
    """Weights in exponential buckets: bucket i holds values in [b^i, b^(i+1)) of the unit."""

    def __init__(self, half_life: float = HALF_LIFE, ratio: float = BUCKET_RATIO) -> None:
        self.half_life, self.log_ratio = half_life, math.log(ratio)
        self.weights: dict[int, float] = {}
        self.total = 0.0

    def add(self, value: float, age: float) -> None:
        i = math.floor(math.log(max(value, 1.0)) / self.log_ratio)
        w = 2.0 ** (-max(age, 0.0) / self.half_life)
        self.weights[i] = self.weights.get(i, 0.0) + w
        self.total += w

    def percentile(self, p: float) -> float:
        """The upper edge of the bucket where the cumulative weight reaches p (0 when empty)."""
        if self.total <= 0:
            return 0.0
        acc = 0.0
        for i in sorted(self.weights):
            acc += self.weights[i]
            if acc >= p * self.total - 1e-12:
                return math.exp((i + 1) * self.log_ratio)
        return math.exp((max(self.weights) + 1) * self.log_ratio)


def weighted_percentile(values: Sequence[float], weights: Sequence[float], p: float) -> float:
    """The p-quantile of `values` weighted by `weights`, interpolated between neighbours as numpy's
    default (linear) does for equal weights: the sample's position is its cumulative weight
    before it, over the total weight of all but the last sample."""
    pairs = sorted(zip(values, weights, strict=True))
    if not pairs:
        return 0.0
    if len(pairs) == 1:
        return pairs[0][0]
    cum, positions = 0.0, []
    for _, w in pairs:
        positions.append(cum)
        cum += w
    span = cum - pairs[-1][1]
    target = p * span
    for i in range(1, len(pairs)):
        if positions[i] >= target:
            lo, hi = positions[i - 1], positions[i]
            frac = (target - lo) / (hi - lo) if hi > lo else 1.0
            return pairs[i - 1][0] + frac * (pairs[i][0] - pairs[i - 1][0])
    return pairs[-1][0]


@dataclass(frozen=True)
class Backtest:
    request: float
    over: int  # samples above the request: throttled (CPU) or killed (memory)
    samples: int

    def to_dict(self, unit: str) -> dict[str, Any]:
        return {"request": round(self.request, 1), "unit": unit, "over": self.over, "samples": self.samples}


@dataclass(frozen=True)
class Resource:
    target: float
    lower: float
    upper: float
    current: float
    observed_peak: float
    percentile: float  # the histogram's p90 (CPU) or the peak-based base (memory), before margin
    backtest_current: Backtest
    backtest_target: Backtest
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recommendation:
    workload: str
    cpu: Resource | None  # millicores
    memory: Resource | None  # bytes
    history_seconds: float
    samples: int
    confidence: float
    evidence: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        def res(r: Resource | None, unit: str, scale: float) -> dict[str, Any] | None:
            if r is None:
                return None
            return {"target": round(r.target / scale), "lower": round(r.lower / scale), "upper": round(r.upper / scale),
                    "current": round(r.current / scale), "observedPeak": round(r.observed_peak / scale, 1),
                    "unit": unit,
                    "backtest": {"atCurrent": _bt(r.backtest_current, scale, unit),
                                 "atTarget": _bt(r.backtest_target, scale, unit)},
                    "notes": list(r.notes)}

        return {"workload": self.workload, "cpu": res(self.cpu, "millicores", 1.0),
                "memory": res(self.memory, "MiB", 2**20), "historySeconds": round(self.history_seconds),
                "samples": self.samples, "confidence": round(self.confidence, 3),
                "confidenceText": confidence_text(self.confidence), "evidence": list(self.evidence),
                "notes": list(self.notes)}


def _bt(b: Backtest, scale: float, unit: str) -> dict[str, Any]:
    return {"request": round(b.request / scale), "unit": unit, "over": b.over, "samples": b.samples}


def confidence_text(c: float) -> str:
    return "high" if c >= 0.9 else "medium" if c >= 0.3 else "low"


def backtest(values: Sequence[float], request: float) -> Backtest:
    """How many samples exceed `request`: the replay of the history at that request."""
    return Backtest(request, sum(1 for v in values if v > request), len(values))


def _widen(target: float, history: float) -> tuple[float, float]:
    days = max(history, 60.0) / 86400.0
    return target * (1 + 0.001 / days) ** -2, target * (1 + 1 / days)


def cpu_recommendation(points: Sequence[tuple[float, float]], now: float, current_milli: float,
                       history: float) -> Resource | None:
    """`points`: (time, CPU in percent of one core) samples."""
    if not points:
        return None
    milli = [v * 10.0 for _, v in points]  # percent of a core -> millicores
    # The decaying weights of VPA's histogram, on the samples themselves (at most a few thousand
    # per query): no bucket rounding on top of the margin.
    p90 = weighted_percentile(milli, [2.0 ** (-max(now - t, 0.0) / HALF_LIFE) for t, _ in points], 0.90)
    target = max(p90 * (1 + CPU_MARGIN), MIN_CPU_MILLI)
    notes = []
    at_cap = sum(1 for m in milli if current_milli and m >= 0.95 * current_milli)
    if current_milli and at_cap > CAPPED_SHARE * len(milli):
        target = max(target, current_milli * 1.2)
        notes.append(f"{at_cap} of {len(milli)} samples at the current limit: demand above it is not seen")
    lower, upper = _widen(target, history)
    return Resource(target, min(lower, target), max(upper, target), current_milli, max(milli), p90,
                    backtest(milli, current_milli), backtest(milli, target), tuple(notes))


def memory_recommendation(points: Sequence[tuple[float, float]], now: float, current_bytes: float,
                          history: float, oom_kills: int = 0) -> Resource | None:
    """`points`: (time, memory bytes, the step's maximum) samples."""
    if not points:
        return None
    values = [v for _, v in points]
    peak = max(values)
    daily: dict[int, tuple[float, float]] = {}
    for t, v in points:
        day = int(t // 86400)
        daily[day] = (max(daily.get(day, (0.0, t))[0], v), max(daily.get(day, (0.0, t))[1], t))
    h = DecayingHistogram()
    for v, t in daily.values():
        h.add(v, now - t)
    base = max(peak, h.percentile(0.95) if len(daily) > 1 else peak)
    target = max(base * (1 + MEMORY_MARGIN), MIN_MEMORY)
    notes = []
    if oom_kills and current_bytes:
        bumped = max(current_bytes * (1 + OOM_BUMP), current_bytes + OOM_MIN_BYTES)
        if bumped > target:
            target = bumped
        notes.append(f"{oom_kills} OOM kill(s) at {current_bytes / 2**20:.0f} MiB: at least +20 % or +100 MiB")
    lower, upper = _widen(target, history)
    lower = max(lower, peak)  # never below what its peaks needed
    return Resource(target, min(lower, target), max(upper, target), current_bytes, peak, base,
                    backtest(values, current_bytes), backtest(values, target), tuple(notes))


def recommend(workload: str, cpu: Sequence[tuple[float, float]], memory: Sequence[tuple[float, float]], now: float,
              current_cpu_milli: float, current_memory_mb: float, oom_kills: int = 0,
              evidence: tuple[str, ...] = ()) -> Recommendation:
    times = [t for t, _ in (*cpu, *memory)]
    history = (max(times) - min(times)) if times else 0.0
    notes = [] if times else ["no meter samples: nothing to recommend from (is Persys Meter running?)"]
    return Recommendation(
        workload,
        cpu_recommendation(cpu, now, current_cpu_milli, history),
        memory_recommendation(memory, now, current_memory_mb * 2**20, history, oom_kills),
        history, max(len(cpu), len(memory)), min(1.0, history / FULL_HISTORY), evidence, tuple(notes))
