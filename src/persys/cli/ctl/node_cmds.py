"""persysctl's node commands: image load|ls|rm, cordon, uncordon, drain, label, taint."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from persys.cli.ctl.api import (
    Api,
    OutputOpt,
    ServerOpt,
    age_text,
    check_output,
    emit,
    err_console,
    fail,
    out,
    resource_kind,
    size_text,
)
from persys.cli.output.safe_text import cell

IMAGE_KINDS = ("docker", "rootfs", "disk", "kernel", "initrd")
HELD_KINDS = ("docker", "disk", "kernel", "initrd")
image_app = typer.Typer(help="Images on nodes: load them without a registry, list them, remove them.",
                        no_args_is_help=True)


def _targets(api: Api, node: list[str]) -> list[str]:
    targets = node or [n["id"] for n in api.request("GET", "/v1/nodes") if n["status"] == "Ready"]
    if not targets:
        fail("no Ready node (name one with --node)")
    return targets


@image_app.command("load")
def image_load(
    file: Path = typer.Argument(..., help="The image file."),
    kind: str = typer.Option("docker", "--kind", help="docker (a `docker save` tarball), rootfs (a filesystem "
                             "tarball, imported as --name), disk, kernel or initrd (for VMs, registered as --name)."),
    name: str = typer.Option("", "--name", help="Image name (rootfs: repo:tag; VM kinds: the registry name)."),
    node: list[str] = typer.Option([], "--node", help="Only these nodes (default: every Ready node)."),
    server: str | None = ServerOpt,
) -> None:
    """Load an image onto nodes, e.g. `persysctl image load app.tar` or
    `persysctl image load --kind disk --name debian-12 debian.qcow2`."""
    if not file.is_file():
        fail(f"{file}: no such file")
    if kind not in IMAGE_KINDS:
        fail(f"kind must be one of {', '.join(IMAGE_KINDS)}")
    api = Api(server)
    targets = _targets(api, node)
    size = file.stat().st_size
    for n in targets:
        # Streamed from the file (with its Content-Length), never read whole into memory.
        with err_console.status(f"loading {file.name} ({size_text(size)}) onto node/{n} ..."), file.open("rb") as f:
            r = api.request("POST", f"/v1/nodes/{n}/images", params={"kind": kind, "name": name}, content=f,
                            headers={"content-type": "application/octet-stream", "content-length": str(size)})
        out.print(f"node/{n}: {r['detail']}", highlight=False)


@image_app.command("ls")
def image_ls(
    node: list[str] = typer.Option([], "--node", help="Only these nodes (default: every Ready node)."),
    kind: str = typer.Option("", "--kind", help="Only docker (the container engine), disk, kernel or initrd."),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    """List the images nodes hold: the container engine's (one line per tag) and the VM image
    registry's, with the instances on the node that use each, e.g. `persysctl image ls --node n1`."""
    check_output(output)
    if kind and kind not in HELD_KINDS:
        fail(f"--kind must be one of {', '.join(HELD_KINDS)}")
    api = Api(server)
    rows: list[dict[str, Any]] = []
    for n in _targets(api, node):
        answer = api.request("GET", f"/v1/nodes/{n}/images")
        for why in answer["unavailable"]:
            err_console.print(f"node/{n}: could not read {why}", highlight=False, markup=False)
        rows += [{"node": n, **i} for i in answer["images"] if not kind or i["kind"] == kind]
    t = Table(box=None, header_style="bold", pad_edge=False)
    wide = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("NODE", "KIND", "NAME", "SIZE", "AGE", "USED BY"):
        t.add_column(col, overflow="fold")
    for col in ("NODE", "KIND", "NAME", "ID", "FORMAT", "SIZE", "AGE", "USED BY"):
        wide.add_column(col, overflow="fold")
    for r in rows:
        size, age, used = size_text(r["size"]), age_text(r["createdAt"]), ",".join(r["usedBy"]) or "-"
        t.add_row(*map(cell, (r["node"], r["kind"], r["name"], size, age, used)))
        short = r["id"].removeprefix("sha256:")[:12]
        wide.add_row(*map(cell, (r["node"], r["kind"], r["name"], short, r["format"] or "-", size, age, used)))
    if not rows and output in ("table", "wide"):
        out.print("No images found.")
        return
    emit(rows, output, t, wide=wide, kind="image")


@image_app.command("rm")
def image_rm(
    name: str = typer.Argument(..., help="The image: repo:tag or an image id (docker), or the VM registry name."),
    kind: str = typer.Option("docker", "--kind", help="docker (the container engine), disk, kernel or initrd."),
    node: list[str] = typer.Option([], "--node", help="Only these nodes (default: every Ready node)."),
    server: str | None = ServerOpt,
) -> None:
    """Remove an image from nodes, e.g. `persysctl image rm busybox:1.36` or
    `persysctl image rm --kind disk debian-12 --node n1`. Refused on a node where a workload uses
    it; a node without it says so (not an error: the command can be repeated)."""
    if kind not in HELD_KINDS:
        fail(f"--kind must be one of {', '.join(HELD_KINDS)}")
    api = Api(server)
    for n in _targets(api, node):
        r = api.request("DELETE", f"/v1/nodes/{n}/images", params={"kind": kind, "name": name}, missing_ok=True)
        out.print(f"node/{n}: {r['detail'] if r else f'no {kind} image {name} here'}", highlight=False, markup=False)


def _node_kind(kind: str) -> None:
    if resource_kind(kind) != "nodes":
        fail("only nodes can be labelled or tainted")


def cordon(node: str = typer.Argument(..., help="Node name."), server: str | None = ServerOpt) -> None:
    """Stop placing new workloads on a node; what runs there keeps running."""
    Api(server).request("POST", f"/v1/nodes/{node}/cordon")
    out.print(f"node/{node} cordoned", highlight=False)


def uncordon(node: str = typer.Argument(..., help="Node name."), server: str | None = ServerOpt) -> None:
    """Allow placements on a node again (also ends a drain)."""
    Api(server).request("POST", f"/v1/nodes/{node}/uncordon")
    out.print(f"node/{node} uncordoned", highlight=False)


def drain(
    node: str = typer.Argument(..., help="Node name."),
    deadline: float = typer.Option(300.0, "--deadline", help="Give up waiting after this many seconds."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Show progress until the drain is done."),
    server: str | None = ServerOpt,
) -> None:
    """Cordon a node and move its workloads elsewhere. Done only when nothing runs on the node any
    more and everything moved runs elsewhere; workloads with node-local volumes block the drain."""
    api = Api(server)
    status = api.request("POST", f"/v1/nodes/{node}/drain", params={"deadline": deadline})
    if not wait:
        out.print(f"node/{node} draining", highlight=False)
        return
    end = time.monotonic() + deadline
    seen: set[str] = set()  # instances seen on the node or moving off it: what the drain moved
    with err_console.status(f"draining node/{node} ...") as spinner:
        while True:
            seen.update(i["instance"] for i in status["remaining"] + status["moving"])
            if status["done"] or (status["blocked"] and not status["remaining"] and not status["moving"]):
                break
            if time.monotonic() > end:
                fail(f"node/{node} not drained after {deadline:.0f}s: {drain_progress(status)}; " +
                     "; ".join(_stuck(i) for i in status["remaining"] + status["moving"]))
            spinner.update(f"draining node/{node}: {drain_progress(status)}")
            time.sleep(0.5)
            status = api.request("GET", f"/v1/nodes/{node}/drain")
    if status["blocked"]:
        fail(f"node/{node} cannot be drained completely: " +
             "; ".join(f"{b['instance']}: {b['reason']}" for b in status["blocked"]))
    out.print(f"node/{node} drained ({len(seen)} instance(s) moved off it)", highlight=False)


def drain_progress(status: dict[str, Any]) -> str:
    """`2 still on the node, 3 moving (1 waiting for room), 0 blocked`: a Pending instance with
    no node is moving too, waiting for a node it fits on."""
    waiting = sum(1 for m in status["moving"] if not m.get("node"))
    return (f"{len(status['remaining'])} still on the node, {len(status['moving'])} moving "
            f"({waiting} waiting for room), {len(status['blocked'])} blocked")


def _stuck(i: dict[str, Any]) -> str:
    if i.get("node"):
        return f"{i['instance']}: {i.get('phase', '')} on {i['node']}"
    if "phase" in i and "message" not in i:
        return f"{i['instance']}: still on the node ({i['phase'] or 'unknown'})"
    why = (i.get("message") or "").split(". Per node: ", 1)[0]
    return f"{i['instance']}: {i.get('phase', '')} ({i.get('reason', '')}): {why}"


def label(
    kind: str = typer.Argument(..., help="node"),
    node: str = typer.Argument(..., help="Node name."),
    changes: list[str] = typer.Argument(..., help="key=value to set, key- to remove."),
    server: str | None = ServerOpt,
) -> None:
    """Set or remove operator labels on a node (merged over the agent's own labels)."""
    _node_kind(kind)
    set_labels: dict[str, str] = {}
    remove: list[str] = []
    for c in changes:
        if c.endswith("-") and "=" not in c:
            remove.append(c[:-1])
        elif "=" in c and c.split("=", 1)[0]:
            k, v = c.split("=", 1)
            set_labels[k] = v
        else:
            fail(f"{c!r}: use key=value to set a label or key- to remove it")
    Api(server).request("POST", f"/v1/nodes/{node}/labels", json={"set": set_labels, "remove": remove})
    out.print(f"node/{node} {_changed('labelled', 'unlabelled', bool(set_labels), bool(remove))}", highlight=False)


def taint(
    kind: str = typer.Argument(..., help="node"),
    node: str = typer.Argument(..., help="Node name."),
    changes: list[str] = typer.Argument(..., help="key=value:Effect to add, key- or key:Effect- to remove."),
    server: str | None = ServerOpt,
) -> None:
    """Add or remove operator taints (effects: NoSchedule, PreferNoSchedule, NoExecute)."""
    _node_kind(kind)
    add: list[dict[str, str]] = []
    remove: list[str] = []
    for c in changes:
        if c.endswith("-"):
            remove.append(c[:-1])
            continue
        kv, _, effect = c.partition(":")
        k, _, v = kv.partition("=")
        if not k or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            fail(f"{c!r}: use key=value:NoSchedule|PreferNoSchedule|NoExecute, or key- to remove")
        add.append({"key": k, "value": v, "effect": effect})
    Api(server).request("POST", f"/v1/nodes/{node}/taints", json={"add": add, "remove": remove})
    out.print(f"node/{node} {_changed('tainted', 'untainted', bool(add), bool(remove))}", highlight=False)


def _changed(added: str, removed: str, adds: bool, removes: bool) -> str:
    """What a label or taint command did, in kubectl's words."""
    if adds and removes:
        return f"{added} and {removed}"
    return added if adds else removed


def register(app: typer.Typer) -> None:
    """Add the node commands to persysctl."""
    app.add_typer(image_app, name="image")
    for command in (cordon, uncordon, drain, label, taint):
        app.command()(command)
