"""What `persysctl top` and `persysctl events` print as tables, as plain data: the columns, their
alignment and each row's cells. Both clients draw from here (the full client with rich, the
quick path with `cli.plain_table`), so they cannot drift apart. Pure."""

from __future__ import annotations

from typing import Any, Literal

from persys.cli.output.listing_rows import age_text

TOP_WORKLOAD_COLUMNS = ("NAME", "TYPE", "READY", "NODE", "CPU%", "MEMORY", "DISK READ", "DISK WRITE", "NET RX",
                        "NET TX")
TOP_NODE_COLUMNS = ("NAME", "STATUS", "CPU%", "MEMORY USED", "WORKLOADS")
EVENT_COLUMNS = ("AGE", "KIND", "SUBJECT", "MESSAGE")
Justify = Literal["left", "right"]


def size_text(n: float) -> str:
    """A byte count as people read it (KiB, MiB, GiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def top_columns(kind: str) -> tuple[tuple[str, Justify], ...]:
    """(header, justify) of `top workloads|nodes`: a workload's figures are right-aligned."""
    if kind == "workloads":
        return tuple((c, "left" if c in ("NAME", "TYPE", "NODE") else "right") for c in TOP_WORKLOAD_COLUMNS)
    return tuple((c, "left") for c in TOP_NODE_COLUMNS)


def top_rows(kind: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows `top` shows (and prints as they are with -o json|yaml)."""
    if kind == "workloads":
        return [{"name": w["name"], "type": w["type"], "ready": w["ready"], "node": ",".join(w["nodes"]) or "-",
                 **w["usage"]} for w in items]
    return [{"name": n["id"], "status": n["status"], **n.get("usage", {})} for n in items]


def top_cells(kind: str, r: dict[str, Any]) -> list[str]:
    """One row of `top`'s table."""
    if kind == "workloads":
        # A host process shares the node's network: its traffic is not measured, not zero.
        net = ["-", "-"] if r["type"] == "process" else [size_text(r["netRxBytes"]), size_text(r["netTxBytes"])]
        return [r["name"], r["type"], r["ready"], r["node"], f"{r['cpuPercent']:.1f}", size_text(r["memoryBytes"]),
                size_text(r["diskReadBytes"]), size_text(r["diskWriteBytes"]), *net]
    return [r["name"], r["status"], f"{r.get('cpuPercent', 0):.1f}", f"{r.get('memoryUsedMb', 0)} MiB",
            str(r.get("workloads", 0))]


def event_cells(e: dict[str, Any]) -> list[str]:
    """One row of `events`' table."""
    return [age_text(e["ts"]), e["kind"], e["subject"], e["message"]]
