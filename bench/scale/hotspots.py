"""Reading a CPU profile of the scheduler: py-spy raw (collapsed stacks) or a cProfile file.

Run on its own: .venv/bin/python bench/scale/hotspots.py PROFILE [--top 15]
"""

from __future__ import annotations

import argparse
import pstats
import re
from collections import Counter
from pathlib import Path
from typing import Any

_LINE = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")

# Buckets for "where does the time go", matched against the whole stack, first match wins.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("placement snapshot rebuild", ("PlacementService._build", "PlacementService._rebuild", "Snapshot.__init__",
                                    "Snapshot.__post_init__")),
    ("state backups (full range + JSON)", ("backup", "persys/scheduler/api/backup.py")),
    ("placement reservation overlay", ("with_reservations", "apply_reserved", "_overlay")),
    ("placement decide (engine)", ("placement/engine.py", "placement/filters.py", "placement/scorers.py",
                                   "placement/evaluate.py", "placement/snapshot.py")),
    ("desired-state streaming", ("WatchAssignments", "persys/scheduler/work/delivery.py")),
    ("status reports", ("ReportStatus", "report (persys/scheduler/api/agents.py", "_record_report")),
    ("heartbeats", ("Heartbeat",)),
    ("registration", ("RegisterNode", "register (persys/scheduler/api/agents.py")),
    ("apply (validate + commit)", ("ApplyWorkload", "persys/scheduler/api/workloads.py")),
    ("mirror: watch fold (decode docs)", ("ClusterState._follow", "ClusterState._apply_event")),
    ("store txn / etcd client", ("persys/store/etcd.py", "ClusterState.commit")),
    ("reconcile (other)", ("persys/scheduler/work/reconcile_worker.py", "persys/scheduler/work/placer.py",
                           "persys/scheduler/decide/reconcile.py")),
    ("events publisher (Redis)", ("persys/events/outbox.py", "redis/")),
    ("node monitor", ("persys/scheduler/work/node_monitor.py", "enqueue_pending")),
    ("gRPC aio poller thread (_poll_wrapper, native)", ("Thread.run", "Thread._bootstrap")),
    ("event loop / gRPC aio native code", ("Handle._run", "_run_once")),
]


def _frame(raw: str) -> str:
    m = _LINE.match(raw.strip())
    return f"{m.group('func')} ({m.group('file')})" if m else raw.strip()


def _leaf_kind(frame: str) -> str:
    for needle, kind in (
        ("pydantic", "pydantic (validate / dump)"), ("json/", "json"), ("protobuf", "protobuf"),
        ("grpc", "grpc"), ("asyncio/", "asyncio"), ("persys/", "persys code"),
    ):
        if needle in frame:
            return kind
    return "other"


def from_pyspy(path: Path, top: int = 15) -> dict[str, Any]:
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    cats: Counter[str] = Counter()
    leaf_kinds: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = [_frame(f) for f in stack.split(";")]
        total += count
        self_c[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
        joined = ";".join(frames)
        cats[next((name for name, needles in CATEGORIES if any(n in joined for n in needles)), "other")] += count
        leaf_kinds[_leaf_kind(frames[-1])] += count
    pct = (lambda c: round(100.0 * c / total, 1)) if total else (lambda c: 0.0)
    # Entry frames (the CLI wrapping asyncio.run) are in every stack and say nothing.
    persys_incl = [(f, c) for f, c in incl.most_common() if "persys/" in f and "persys/cli/" not in f]
    return {
        "tool": "py-spy",
        "samples": total,
        "top_self": [{"function": f, "samples": c, "pct": pct(c)} for f, c in self_c.most_common(top)],
        "top_inclusive_persys": [{"function": f, "samples": c, "pct": pct(c)} for f, c in persys_incl[:top]],
        "categories": [{"category": k, "samples": c, "pct": pct(c)} for k, c in cats.most_common()],
        "leaf_kinds": [{"kind": k, "samples": c, "pct": pct(c)} for k, c in leaf_kinds.most_common()],
    }


def from_cprofile(path: Path, top: int = 15) -> dict[str, Any]:
    st = pstats.Stats(str(path))
    rows = st.stats  # type: ignore[attr-defined]

    def name(k: tuple[str, int, str]) -> str:
        return f"{k[2]} ({k[0]}:{k[1]})"

    # Waiting in epoll is idle time, not work: leave it out, like py-spy does.
    busy_rows = {k: v for k, v in rows.items() if "select.epoll" not in k[2]}
    total = sum(v[2] for v in busy_rows.values()) or 1.0
    by_self = sorted(busy_rows.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    by_cum = sorted(((k, v) for k, v in busy_rows.items() if "persys" in k[0] and "persys/cli/" not in k[0]),
                    key=lambda kv: kv[1][3], reverse=True)
    return {
        "tool": "cProfile",
        "total_seconds": round(total, 2),
        "top_self": [{"function": name(k), "seconds": round(v[2], 2), "pct": round(100 * v[2] / total, 1)}
                     for k, v in by_self],
        "top_inclusive_persys": [{"function": name(k), "seconds": round(v[3], 2),
                                  "pct": round(100 * v[3] / total, 1)} for k, v in by_cum[:top]],
    }


def render(h: dict[str, Any], top: int = 10) -> str:
    unit = "samples" if h.get("tool") == "py-spy" else "seconds"
    out = [f"profile ({h.get('tool')}, {h.get('samples', h.get('total_seconds'))} {unit}):",
           f"  top {top} functions by self time:"]
    for i, r in enumerate(h.get("top_self", [])[:top], 1):
        out.append(f"   {i:2d}. {r['pct']:5.1f}%  {r['function']}")
    out.append(f"  top {top} persys functions by inclusive time:")
    for i, r in enumerate(h.get("top_inclusive_persys", [])[:top], 1):
        out.append(f"   {i:2d}. {r['pct']:5.1f}%  {r['function']}")
    if h.get("categories"):
        out.append("  where the time goes (whole stack, first matching bucket):")
        out += [f"       {r['pct']:5.1f}%  {r['category']}" for r in h["categories"]]
    if h.get("leaf_kinds"):
        out.append("  leaf frames by library: " + ", ".join(f"{r['kind']} {r['pct']}%" for r in h["leaf_kinds"]))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile", type=Path)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    if args.profile.suffix in (".prof", ".pstats"):
        h = from_cprofile(args.profile, args.top)
    else:
        h = from_pyspy(args.profile, args.top)
    print(render(h, args.top))


if __name__ == "__main__":
    main()
