"""persysctl's node commands: image load, cordon, uncordon, drain, label, taint."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from persys.cli.api import Api, ServerOpt, err_console, fail, out, resource_kind, size_text

IMAGE_KINDS = ("docker", "rootfs", "disk", "kernel", "initrd")
image_app = typer.Typer(help="Put images on nodes without a registry.", no_args_is_help=True)


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
    targets = node or [n["id"] for n in api.request("GET", "/v1/nodes") if n["status"] == "Ready"]
    if not targets:
        fail("no Ready node to load the image onto")
    size = file.stat().st_size
    for n in targets:
        # Streamed from the file (with its Content-Length), never read whole into memory.
        with err_console.status(f"loading {file.name} ({size_text(size)}) onto node/{n} ..."), file.open("rb") as f:
            r = api.request("POST", f"/v1/nodes/{n}/images", params={"kind": kind, "name": name}, content=f,
                            headers={"content-type": "application/octet-stream", "content-length": str(size)})
        out.print(f"node/{n}: {r['detail']}", highlight=False)


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
    with err_console.status(f"draining node/{node} ...") as spinner:
        while not status["done"]:
            if status["blocked"] and not status["remaining"] and not status["moving"]:
                break
            if time.monotonic() > end:
                stuck = ", ".join(i["instance"] for i in status["remaining"] + status["moving"])
                fail(f"node/{node} still has {len(status['remaining'])} on it and {len(status['moving'])} moving "
                     f"after {deadline:.0f}s: {stuck}")
            spinner.update(f"draining node/{node}: {len(status['remaining'])} still on the node, "
                           f"{len(status['moving'])} moving, {len(status['blocked'])} blocked")
            time.sleep(0.5)
            status = api.request("GET", f"/v1/nodes/{node}/drain")
    if status["blocked"]:
        fail(f"node/{node} cannot be drained completely: " +
             "; ".join(f"{b['instance']}: {b['reason']}" for b in status["blocked"]))
    out.print(f"node/{node} drained", highlight=False)


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
