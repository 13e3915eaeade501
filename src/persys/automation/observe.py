"""From meter series to an autoscale observation: pure, shared by the live loop and replay (so
that both decide on the same figure from the same samples).

A meter answer holds one series per instance, points `[bucket start, value]` at the query's
step. A window's figure per instance is the mean of its points in (now - window, now]; the
workload's total is the sum over the instances that have any (`reporting`); the newest point's
time says how fresh it is. Only the instances named (the workload's current ones) count: an
instance removed by a scale-in keeps points in the window, and must not count as load.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class Series:
    key: str  # the instance
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class WindowFigure:
    total: float | None
    newest: float | None
    reporting: int


def series_of(answer: dict[str, object]) -> list[Series]:
    """A meter answer (`SchedulerClient.meter_query`) as Series."""
    out = []
    for s in answer.get("series", []) or []:  # type: ignore[attr-defined]
        out.append(Series(str(s.get("key", "")), tuple((float(t), float(v)) for t, v in s.get("points", []))))
    return out


def scale(metric: str, value: float) -> float:
    """The meter's unit to the policy's: CPU stays percent of one core; memory bytes become MiB."""
    return value / MIB if metric == "memory" else value


def window_figure(series: Iterable[Series], now: float, window: float, metric: str,
                  instances: Collection[str] | None = None) -> WindowFigure:
    total, newest, reporting = 0.0, None, 0
    for s in series:
        if instances is not None and s.key not in instances:
            continue
        pts = [(t, v) for t, v in s.points if now - window < t <= now]
        if not pts:
            continue
        reporting += 1
        total += scale(metric, sum(v for _, v in pts) / len(pts))
        last = max(t for t, _ in pts)
        newest = last if newest is None else max(newest, last)
    return WindowFigure(total if reporting else None, newest, reporting)


def instances_with_points(series: Sequence[Series], start: float, end: float) -> set[str]:
    return {s.key for s in series if any(start < t <= end for t, _ in s.points)}
