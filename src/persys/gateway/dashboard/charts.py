"""Usage history charts from Persys Meter, drawn on the server as SVG: no charting library, no
script, nothing for the Content-Security-Policy to allow. One chart per metric, one line per
instance (or the node), the range chosen by the user (15 minutes to a day)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from persys.client import SchedulerError
from persys.gateway.dashboard.html import Html, join, link, tag
from persys.gateway.dashboard.web import Ctx

# range -> (seconds, step in seconds): about 60-100 points a line
RANGES: dict[str, tuple[int, int]] = {"15m": (900, 15), "1h": (3600, 60), "6h": (21600, 300), "24h": (86400, 900)}
CHARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("CPU", "percent of one core", ("cpu",)), ("Memory", "bytes", ("memory",)),
    ("Disk", "bytes/s (read, write)", ("disk-read", "disk-write")),
    ("Network", "bytes/s (received, sent)", ("net-rx", "net-tx")))
COLOURS = ("#0b5cad", "#a40e26", "#116329", "#7d4e00", "#6f42c1", "#1b1f24")
W, H, PAD = 560, 150, 34


def human(v: float, unit: str) -> str:
    if unit.startswith("bytes"):
        for suffix, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(v) >= size:
                return f"{v / size:.1f} {suffix}"
        return f"{v:.0f} B"
    return f"{v:.1f}%" if unit.startswith("percent") else f"{v:.3g}"


def svg_chart(title: str, unit: str, lines: Sequence[tuple[str, Sequence[Sequence[float]]]], start: float,
              end: float) -> Html:
    """A line chart: `lines` are (label, [[t, v], ...]); the y axis from 0 to the largest value."""
    values = [float(v) for _, pts in lines for _, v in pts]
    top = max(values) if values else 0.0
    top = top * 1.1 if top > 0 else 1.0
    span = max(end - start, 1.0)

    def xy(t: float, v: float) -> str:
        return f"{PAD + (t - start) / span * (W - PAD - 4):.1f},{H - 18 - float(v) / top * (H - 30):.1f}"

    polylines = [tag("polyline", points=" ".join(xy(float(t), float(v)) for t, v in pts), fill="none",
                     stroke=COLOURS[i % len(COLOURS)], stroke_width="1.6")
                 for i, (_, pts) in enumerate(lines) if pts]
    # A dot per point too: a line of one sample (a new workload) is still seen.
    dots = [tag("circle", cx=xy(float(t), float(v)).split(",")[0], cy=xy(float(t), float(v)).split(",")[1], r="2",
                fill=COLOURS[i % len(COLOURS)]) for i, (_, pts) in enumerate(lines) for t, v in pts[-200:]]
    grid = [tag("line", x1=str(PAD), x2=str(W - 4), y1=str(y), y2=str(y), stroke="#d0d7de") for y in (12, H - 18)]
    labels = [tag("text", human(top, unit), x="2", y="16", font_size="10", fill="#505a66"),
              tag("text", "0", x="2", y=str(H - 18), font_size="10", fill="#505a66"),
              tag("text", time.strftime("%H:%M", time.gmtime(start)), x=str(PAD), y=str(H - 4), font_size="10",
                  fill="#505a66"),
              tag("text", time.strftime("%H:%M UTC", time.gmtime(end)), x=str(W - 70), y=str(H - 4), font_size="10",
                  fill="#505a66")]
    legend = tag("ul", *(tag("li", tag("span", "■", class_=f"c{i % len(COLOURS)}"), f" {label}")
                         for i, (label, _) in enumerate(lines)), class_="legend")
    latest = "; ".join(f"{label} {human(float(pts[-1][1]), unit)}" for label, pts in lines if pts) or "no samples"
    svg = tag("svg", tag("title", f"{title}: {latest}"), *grid, *polylines, *dots, *labels, viewBox=f"0 0 {W} {H}",
              role="img", aria_label=f"{title} ({unit}), latest: {latest}", class_="chart")
    return tag("figure", tag("figcaption", tag("strong", title), f" ({unit})"), svg, legend, class_="chart-box")


def _lines(answers: Sequence[Mapping[str, Any]], names: Sequence[str]) -> list[tuple[str, list[list[float]]]]:
    out = []
    for metric, answer in zip(names, answers, strict=True):
        suffix = f" {metric.split('-')[-1]}" if len(names) > 1 else ""
        for s in answer.get("series") or []:
            label = str(s.get("key") or s.get("workload") or s.get("node") or "?") + suffix
            out.append((label, [[float(t), float(v)] for t, v in s.get("points") or []]))
    return out


async def usage_section(ctx: Ctx, selector: str, name: str, href: str) -> Html:
    """Charts of `selector` (workload or node) `name` over the range in `?range=`."""
    if not ctx.session.can("get", "telemetry"):
        return tag("p", "Your role does not read usage history.", class_="muted")
    chosen = ctx.arg("range") if ctx.arg("range") in RANGES else "1h"
    window, step = RANGES[chosen]
    picker = tag("p", "Range: ", join((tag("strong", r) if r == chosen else link(f"{href}?range={r}", r)
                                       for r in RANGES), " · "), class_="ranges")
    metrics = [m for _, _, ms in CHARTS for m in ms]
    try:
        answers = await asyncio.gather(*(ctx.client.meter_query(selector, name, m, window, step, "avg")
                                         for m in metrics))
    except SchedulerError as err:
        return picker + tag("p", f"No usage history: {err.message}", class_="muted")
    by_metric = dict(zip(metrics, answers, strict=True))
    end = max((float(a.get("end") or 0) for a in answers), default=time.time()) or time.time()
    start = end - window
    charts = [svg_chart(title, unit, _lines([by_metric[m] for m in ms], ms), start, end)
              for title, unit, ms in CHARTS]
    return picker + tag("div", *charts, class_="charts")
