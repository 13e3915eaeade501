"""What `get` shows: the kinds a user may name, the pages of a list, column names and cell texts
of workloads and nodes, `-o name` lines.

Standard library only: the rich tables of the full client (`cli.ctl.app`) and the plain renderer of
its quick path (`cli.quick.entry`) print the same rows from here. Cells are made printable (a name a
node supplies cannot carry an escape sequence to the terminal)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from persys.cli.output.safe_text import printable

WORKLOAD_COLUMNS = ("NAME", "TYPE", "READY", "PHASE", "NODE", "REVISION", "RESTARTS", "AGE", "REASON")
WORKLOAD_WIDE = ("NODES", "GENERATION", "UPDATED", "LABELS")
NODE_COLUMNS = ("NAME", "STATUS", "RUNTIMES", "CPU (alloc/total)", "MEMORY MiB (alloc/total)", "WORKLOADS", "AGE")
NODE_WIDE = ("ADDRESS", "VERSION", "LABELS", "TAINTS")
# What a user may type for a resource kind, and the kind it names.
KINDS = {
    "workload": "workloads", "workloads": "workloads", "wl": "workloads",
    "node": "nodes", "nodes": "nodes", "no": "nodes",
    "secret": "secrets", "secrets": "secrets",
    "volume": "volumes", "volumes": "volumes", "vol": "volumes",
    "bucket": "buckets", "buckets": "buckets",
    "policy": "policies", "policies": "policies",  # automation policies (kind: Policy)
}


def name_line(kind: str, item: dict[str, Any]) -> str:
    """`kind/name`, as `-o name` prints an object (kind singular: workload, node, volume...)."""
    return f"{kind}/{item.get('id') or item.get('name') or ''}"


def pages(fetch: Callable[[str, dict[str, str]], Any], kind: str, node: str, chunk: int
          ) -> Iterator[list[dict[str, Any]]]:
    """Every page of `GET /v1/<kind>`, following the gateway's continue tokens; `fetch(path,
    query)` answers one request (each client its own transport)."""
    query = {"limit": str(chunk), **({"node": node} if node else {})}
    token = ""
    while True:
        body = fetch(f"/v1/{kind}", {**query, **({"continue": token} if token else {})})
        if isinstance(body, list):  # a gateway from before pages: everything at once
            yield body
            return
        yield body["items"]
        token = body.get("continue") or ""
        if not token:
            return


def age_text(ts: float) -> str:
    """How long ago a timestamp was, in its largest unit (5m, 3h, 2d)."""
    if not ts:
        return "-"
    s = max(0, int(time.time() - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def labels_text(labels: dict[str, str] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or "-"


def columns(kind: str, wide: bool) -> tuple[str, ...]:
    """The header of `get KIND` (workloads or nodes), with -o wide's extra columns."""
    if kind == "workloads":
        return WORKLOAD_COLUMNS + (WORKLOAD_WIDE if wide else ())
    return NODE_COLUMNS + (NODE_WIDE if wide else ())


def row(kind: str, item: dict[str, Any], wide: bool) -> list[str]:
    cells = _workload_row(item, wide) if kind == "workloads" else _node_row(item, wide)
    return [printable(str(c)) for c in cells]


def _workload_row(w: dict[str, Any], wide: bool) -> tuple[object, ...]:
    reason = w.get("reason", "") if w.get("phase") != "Running" else ""
    nodes = w.get("nodes") or ([w["node"]] if w.get("node") else [])
    node = nodes[0] if len(nodes) == 1 else (f"{len(nodes)} nodes" if nodes else "-")
    more = (",".join(nodes) or "-", w.get("generation", ""), age_text(w.get("updatedAt", 0)),
            labels_text(w.get("labels"))) if wide else ()
    return (w["name"], w["type"], w.get("ready", ""), w["phase"], node, w["revision"], w.get("restarts", 0),
            age_text(w.get("createdAt", 0)), reason, *more)


def _node_row(n: dict[str, Any], wide: bool) -> tuple[object, ...]:
    caps, alloc = n.get("capabilities", {}), n.get("allocated", {})
    status = n["status"] + (",Cordoned" if n.get("cordoned") else "")
    taints = ",".join(f"{x.get('key')}{'=' + x['value'] if x.get('value') else ''}:{x.get('effect')}"
                      for x in n.get("taints") or []) or "-"
    more = (n.get("address") or "-", n.get("agentVersion") or "-", labels_text(n.get("labels")), taints) if wide else ()
    return (n["id"], status, ",".join(sorted(caps.get("runtimes", {}))) or "-",
            f"{alloc.get('cpuMillicores', 0)}m/{caps.get('cpuMillicores', 0)}m",
            f"{alloc.get('memoryMb', 0)}/{caps.get('memoryMb', 0)}", alloc.get("workloads", 0),
            age_text(n.get("registeredAt", 0)), *more)


# Column floors of `get -w` rows: each change is printed alone, so rows line up only when every
# row pads to the same widths; these fit common names, and a wider cell widens its column for the
# rows after it (never narrower again).
WATCH_FLOORS = {"NAME": 24, "ID": 20, "NODE": 12, "REVISION": 12, "STATUS": 10, "RUNTIMES": 16, "CPU": 14,
                "MEMORY": 12, "PHASE": 10, "TYPE": 10, "AGE": 6, "REASON": 12}


def watch_line(header: tuple[str, ...], cells: list[str], widths: list[int]) -> tuple[str, list[int]]:
    """One `get -w` row (or the header, as `cells`) padded to the running column widths, and the
    widths after it. Pure."""
    if not widths:
        widths = [max(len(h), WATCH_FLOORS.get(h, len(h))) for h in header]
    widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=False)] + widths[len(cells):]
    line = "   ".join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=False))
    return (line + ("   " if len(cells) > 1 else "") + (cells[-1] if cells else "")).rstrip(), widths
