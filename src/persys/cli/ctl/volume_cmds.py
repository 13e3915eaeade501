"""persysctl's volume commands: `get|describe|delete volume`, applying `kind: Volume`, and
`volume resize|snapshot ...`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from persys.cli.ctl.api import Api, OutputOpt, ServerOpt, age_text, emit, get_listing, out
from persys.cli.ctl.views import volume_manifest
from persys.cli.output.safe_text import cell

if TYPE_CHECKING:
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
    get_listing(api, "volumes", name, output, volume_table)


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
        "Attached:   " + ("; ".join(_attachment_text(a) for a in v.get("attachments", [])) or "-"),
        f"Created:    {age_text(v['createdAt'])} ago",
    ]
    for line in lines:
        out.print(cell(line), markup=False, highlight=False)


def _attachment_text(a: dict[str, Any]) -> str:
    users = ", ".join(a.get("instances", [])) or "no instance"
    return (f"node {a['node']} as {a['kind']}{' (read-only)' if a.get('readOnly') else ''} for {users}, "
            f"{age_text(a['since'])}")


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


volume_app = typer.Typer(
    help="Volumes beyond apply/get/describe/delete: grow one, and snapshots of network volumes (nfs, "
    "ceph-rbd) taken by the control plane. A snapshot is restored as a new volume cloned from it.",
    no_args_is_help=True)
snapshot_app = typer.Typer(help="Snapshots of a network volume: create, list, delete, restore.", no_args_is_help=True)
volume_app.add_typer(snapshot_app, name="snapshot")


@volume_app.command("resize")
def resize(name: str = typer.Argument(..., help="The volume."),
           size_mb: int = typer.Argument(..., min=1, help="Its new size in MiB (volumes only grow)."),
           server: str | None = ServerOpt) -> None:
    """Grow a volume (`sizeMb` of its record): a network volume's backend is grown by the control
    plane (`describe volume` shows the provisioned size once done)."""
    api = Api(server)
    doc = volume_manifest(api.request("GET", f"/v1/volumes/{name}"))
    doc["spec"]["sizeMb"] = size_mb
    r = api.request("POST", "/v1/volumes", json=doc)
    out.print(f"volume/{name} {'resizing to ' + str(size_mb) + ' MiB' if r['changed'] else 'unchanged'}",
              highlight=False)


@snapshot_app.command("create")
def snapshot_create(name: str = typer.Argument(..., help="The volume."),
                    snapshot: str = typer.Argument(..., help="The snapshot's name (a DNS label)."),
                    server: str | None = ServerOpt) -> None:
    """Ask for a snapshot; idempotent. `volume snapshot list` shows it once taken."""
    r = Api(server).request("POST", f"/v1/volumes/{name}/snapshots", json={"name": snapshot})
    out.print(f"volume/{name} snapshot {snapshot} {'requested' if r['changed'] else 'unchanged'}", highlight=False)


@snapshot_app.command("list")
def snapshot_list(name: str = typer.Argument(..., help="The volume."), output: str = OutputOpt,
                  server: str | None = ServerOpt) -> None:
    """The volume's snapshots: taken, or asked for and not taken yet."""
    v = Api(server).request("GET", f"/v1/volumes/{name}")
    taken, wanted = v.get("snapshots", []), v.get("wantedSnapshots", [])
    rows = [{"snapshot": s, "state": "taken" if s in taken else "pending"} for s in wanted]
    rows += [{"snapshot": s, "state": "deleting"} for s in taken if s not in wanted]
    t = Table(box=None, header_style="bold", pad_edge=False)
    t.add_column("SNAPSHOT")
    t.add_column("STATE")
    for r in rows:
        t.add_row(cell(r["snapshot"]), r["state"])
    if not rows and output == "table":
        out.print(f"volume/{name} has no snapshots.")
        return
    emit(rows, output, t)


@snapshot_app.command("delete")
def snapshot_delete(name: str = typer.Argument(..., help="The volume."),
                    snapshot: str = typer.Argument(..., help="The snapshot."), server: str | None = ServerOpt) -> None:
    """Remove a snapshot (volumes cloned from it keep their data: clones are independent)."""
    r = Api(server).request("DELETE", f"/v1/volumes/{name}/snapshots/{snapshot}")
    out.print(f"volume/{name} snapshot {snapshot} {'deletion requested' if r['changed'] else 'already gone'}",
              highlight=False)


@snapshot_app.command("restore")
def snapshot_restore(name: str = typer.Argument(..., help="The volume."),
                     snapshot: str = typer.Argument(..., help="The snapshot."),
                     to: str = typer.Option(..., "--to", help="The new volume to create from the snapshot."),
                     server: str | None = ServerOpt) -> None:
    """Create a new volume from a snapshot (a clone: the original volume is left as it is; point
    the workload's claim at the new one)."""
    api = Api(server)
    v = api.request("GET", f"/v1/volumes/{name}")
    # Not its reclaimPolicy: the restored volume stands alone (Delete means "with the workload
    # that declares it", which a standalone Volume has not).
    spec = {k: v["spec"][k] for k in ("driver", "sizeMb", "accessMode", "mode")}
    doc = {"apiVersion": "persys.dev/v1", "kind": "Volume", "metadata": {"name": to},
           "spec": {**spec, "source": {"snapshot": f"{name}@{snapshot}"}}}
    r = api.request("POST", "/v1/volumes", json=doc)
    out.print(f"volume/{to} {'created' if r['created'] else 'unchanged'} from {name}@{snapshot}", highlight=False)
