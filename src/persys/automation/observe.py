"""From meter series to an autoscale observation: pure, shared by the live loop and replay (so
that both decide on the same figure from the same samples).

A meter answer holds one series per instance, points `[bucket start, value]` at the query's
step. A window's figure per instance is the mean of its points in (now - window, now]; the
workload's total is the sum over the instances still reporting: those whose newest point is
within `LIVE_STEPS` steps of the newest point of any. An instance removed by a scale-in keeps
points in the window but stops reporting, so it soon stops counting as load; the rule reads the
data alone, so replay (which does not know which instances existed when) applies it the same way.
`reporting` counts the live instances that are among the workload's current ones (live loop).
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

MIB = 1024 * 1024
LIVE_STEPS = 2  # an instance whose newest point is this many steps behind the newest of all has stopped


@dataclass(frozen=True)
class Series:
    key: str  # the instance
    points: tuple[tuple[float, float], ...]  # sorted by time here (the meter answers them so)
    times: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pts = tuple(sorted(self.points))
        object.__setattr__(self, "points", pts)
        object.__setattr__(self, "times", tuple(t for t, _ in pts))

    def within(self, start: float, end: float) -> tuple[tuple[float, float], ...]:
        """The points in (start, end], found by bisection: replay asks this for every decision."""
        return self.points[bisect.bisect_right(self.times, start):bisect.bisect_right(self.times, end)]


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


def window_figure(series: Iterable[Series], now: float, window: float, metric: str, step: float,
                  instances: Collection[str] | None = None) -> WindowFigure:
    inside = [(s.key, pts) for s in series if (pts := s.within(now - window, now))]
    if not inside:
        return WindowFigure(None, None, 0)
    newest = max(pts[-1][0] for _, pts in inside)
    live = [(key, pts) for key, pts in inside if pts[-1][0] > newest - LIVE_STEPS * step]
    total = sum(scale(metric, sum(v for _, v in pts) / len(pts)) for _, pts in live)
    reporting = sum(1 for key, _ in live if instances is None or key in instances)
    return WindowFigure(total, newest, reporting)


def fresh_total(fig: WindowFigure, now: float, stale_after: float) -> float | None:
    """A window's total, or None when it has no samples or its newest is older than `stale_after`
    (scaleToZero's activation figure, live and in replay)."""
    if fig.total is None or fig.newest is None or now - fig.newest > stale_after:
        return None
    return fig.total


def instances_with_points(series: Sequence[Series], start: float, end: float) -> set[str]:
    return {s.key for s in series if any(start < t <= end for t, _ in s.points)}
