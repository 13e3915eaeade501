"""persysctl's volume commands: `get|describe|delete volume` and applying `kind: Volume`."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from persys.cli.api import Api, age_text, emit, out
from persys.cli.safe_text import cell
from persys.model.volume import VolumeManifest


def volume_table(items: list[dict[str, Any]]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("NAME", "DRIVER", "SIZE", "ACCESS", "RECLAIM", "PHASE", "NODE", "USED BY", "AGE"):
        t.add_column(col, overflow="fold")
    for v in items:
        spec = v["spec"]
        t.add_row(*map(cell, (v["id"], spec["driver"], f"{spec['sizeMb']} MiB", spec["accessMode"],
                              spec["reclaimPolicy"], v["phase"], v.get("node") or "-",
                              ",".join(v.get("usedBy", [])) or "-", age_text(v["createdAt"]))))
    return t


def get_volumes(api: Api, name: str | None, output: str) -> None:
    items = [api.request("GET", f"/v1/volumes/{name}")] if name else api.request("GET", "/v1/volumes")
    if not items and output == "table":
        out.print("No volumes found.")
        return
    emit(items, output, volume_table(items))


def describe_volume(api: Api, name: str, output: str) -> None:
    v = api.request("GET", f"/v1/volumes/{name}")
    if output != "text":
        emit(v, output)
        return
    spec = v["spec"]
    source = spec.get("source") or {}
    lines = [
        f"Name:       {v['id']}",
        f"Driver:     {spec['driver']} ({spec['mode']}, {spec['accessMode']})",
        f"Size:       {spec['sizeMb']} MiB" + (f" (provisioned {v['provisionedMb']} MiB)"
                                              if v.get("provisionedMb") not in (None, 0, spec["sizeMb"]) else ""),
        f"Reclaim:    {spec['reclaimPolicy']}" + (f" (declared by workload {v['owner']})" if v.get("owner") else ""),
        f"Phase:      {v['phase']}" + (f": {v['reason']}" if v.get("reason") else ""),
        f"Node:       {v.get('node') or '-'}",
        "Source:     " + (source.get("snapshot") or source.get("volume") or "-"),
        "Snapshots:  " + (", ".join(v.get("snapshots", [])) or "-"),
        "Used by:    " + (", ".join(v.get("usedBy", [])) or "-"),
        f"Created:    {age_text(v['createdAt'])} ago",
    ]
    for line in lines:
        out.print(cell(line), markup=False, highlight=False)


def delete_volume(api: Api, name: str) -> None:
    r = api.request("DELETE", f"/v1/volumes/{name}")
    out.print(f"volume/{name} {'already gone' if r['alreadyGone'] else 'deletion requested'}", highlight=False)


def apply_volumes(api: Api, volumes: list[VolumeManifest], dry_run: bool) -> list[dict[str, Any]]:
    results = []
    for m in volumes:
        doc = m.model_dump(mode="json", by_alias=True, exclude_unset=True)
        r = api.request("POST", "/v1/volumes", params={"dryRun": str(dry_run).lower()}, json=doc)
        verb = "created" if r["created"] else ("configured" if r["changed"] else "unchanged")
        out.print(f"volume/{m.metadata.name} {verb}{' (dry run)' if dry_run else ''}", highlight=False)
        results.append(r)
    return results
