"""persysctl: the Persys command-line client (talks to the REST gateway over mutual TLS)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.table import Table

from persys.cli.api import Api, CtlError, OutputOpt, ServerOpt, emit, err_console, fail, out
from persys.cli.auth_cmds import audit_command, auth_app
from persys.cli.policy_cmd import policy_app
from persys.cli.safe_text import cell, printable
from persys.model.limits import BATCH_MAX_BYTES, MANIFEST_MAX_BYTES, human_bytes
from persys.model.manifest import ManifestError, parse_manifests

app = typer.Typer(
    name="persysctl",
    help=(
        "Control a Persys cluster.\n\n"
        "Examples:\n\n"
        "  persysctl apply -f examples/hello-process.yaml\n\n"
        "  persysctl get workloads\n\n"
        "  persysctl describe workload hello-process\n\n"
        "  persysctl delete workload hello-process\n\n"
        "The cluster is read from $PERSYS_CONFIG or ~/.persys/config.yaml (written by `persys dev`)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

def _age(ts: float) -> str:
    if not ts:
        return "-"
    s = max(0, int(time.time() - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _workload_table(items: list[dict[str, Any]]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("NAME", "TYPE", "READY", "PHASE", "NODE", "REVISION", "RESTARTS", "AGE", "REASON"):
        t.add_column(col, overflow="fold")
    for w in items:
        reason = w.get("reason", "") if w.get("phase") != "Running" else ""
        nodes = w.get("nodes") or ([w["node"]] if w.get("node") else [])
        node = nodes[0] if len(nodes) == 1 else (f"{len(nodes)} nodes" if nodes else "-")
        t.add_row(*map(cell, (w["name"], w["type"], w.get("ready", ""), w["phase"], node, w["revision"],
                              str(w.get("restarts", 0)), _age(w.get("createdAt", 0)), reason)))  # reason: node text
    return t


def _node_table(items: list[dict[str, Any]]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("NAME", "STATUS", "RUNTIMES", "CPU (alloc/total)", "MEMORY MiB (alloc/total)", "WORKLOADS", "AGE"):
        t.add_column(col, overflow="fold")
    for n in items:
        caps, alloc = n.get("capabilities", {}), n.get("allocated", {})
        status = n["status"] + (",Cordoned" if n.get("cordoned") else "")
        t.add_row(*map(cell, (n["id"], status, ",".join(sorted(caps.get("runtimes", {}))) or "-",
                              f"{alloc.get('cpuMillicores', 0)}m/{caps.get('cpuMillicores', 0)}m",
                              f"{alloc.get('memoryMb', 0)}/{caps.get('memoryMb', 0)}",
                              str(alloc.get("workloads", 0)), _age(n.get("registeredAt", 0)))))
    return t


KINDS = {
    "workload": "workloads", "workloads": "workloads", "wl": "workloads",
    "node": "nodes", "nodes": "nodes", "no": "nodes",
}


def _kind(kind: str) -> str:
    k = KINDS.get(kind.lower())
    if k is None:
        fail(f"unknown resource kind {kind!r} (use workloads or nodes)")
    return k


# --------------------------------------------------------------------------- commands


def _read_manifest_files(files: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    docs: list[tuple[str, dict[str, Any]]] = []
    for f in files:
        if str(f) == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            if not f.exists():
                fail(f"{f}: no such file")
            # A file of many manifests may be larger than one; each is checked after parsing.
            if f.stat().st_size > BATCH_MAX_BYTES:
                fail(f"{f}: larger than {human_bytes(BATCH_MAX_BYTES)}, the most one apply may send")
            text, source = f.read_text(), str(f)
        try:
            # Validate locally first: the whole set is refused before anything is written.
            for m in parse_manifests(text, source):
                doc = m.model_dump(mode="json", by_alias=True, exclude_unset=True)
                if len(json.dumps(doc)) > MANIFEST_MAX_BYTES:
                    fail(f"{source}: manifest {m.metadata.name} is larger than {human_bytes(MANIFEST_MAX_BYTES)}")
                docs.append((source, doc))
        except ManifestError as e:
            fail(f"{source}: invalid manifest: " + "; ".join(e.problems))
    return docs


APPLY_BATCH = 500  # manifests per bulk request (and at most half the gateway's batch byte limit)


def _batches(docs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = [[]]
    size = 0
    for d in docs:
        n = len(json.dumps(d)) + 2
        if out[-1] and (len(out[-1]) >= APPLY_BATCH or size + n > BATCH_MAX_BYTES // 2):
            out.append([])
            size = 0
        out[-1].append(d)
        size += n
    return out


@app.command()
def apply(
    files: list[Path] = typer.Option(..., "--filename", "-f", help="Manifest file (YAML or JSON; - for stdin)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and show what would change; write nothing."),
    output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    """Create or update workloads from manifests. Idempotent: applying twice changes nothing."""
    docs = _read_manifest_files(files)
    api = Api(server)
    results = []
    if len(docs) > 1 and not dry_run:  # one request; the scheduler writes new workloads in bulk
        for batch in _batches([d for _, d in docs]):
            results += api.request("POST", "/v1/workloads:batch", json=batch)["items"]
    else:
        results = [api.request("POST", "/v1/workloads", params={"dryRun": str(dry_run).lower()}, json=doc)
                   for _source, doc in docs]
    if output == "text":
        for r in results:
            verb = "created" if r["created"] else ("configured" if r["changed"] else "unchanged")
            out.print(f"workload/{r['id']} {verb}{' (dry run)' if dry_run else ''}", highlight=False)
    if output != "text":
        emit(results, output)


@app.command()
def get(
    kind: str = typer.Argument(..., help="workloads or nodes"),
    name: str | None = typer.Argument(None, help="Only this one."),
    node: str = typer.Option("", "--node", help="Workloads on this node only."),
    chunk_size: int = typer.Option(500, "--chunk-size", min=1, max=5000,
                                   help="Items asked for per request; pages are printed as they arrive."),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    """List workloads or nodes."""
    k = _kind(kind)
    api = Api(server)
    if not name:
        if output not in ("table", "json", "yaml"):
            fail(f"unknown output format {output!r} (use table, json or yaml)")
        _emit_pages(_pages(api, k, node if k == "workloads" else "", chunk_size), output, k)
        return
    items = [api.request("GET", f"/v1/{k}/{name}")]
    table = _workload_table(items) if k == "workloads" else _node_table(items)
    emit(items, output, table)


def _pages(api: Api, kind: str, node: str, chunk: int) -> Iterator[list[dict[str, Any]]]:
    """Every page of a list, following the gateway's continue tokens."""
    params = {"limit": str(chunk), **({"node": node} if node else {})}
    token = ""
    while True:
        body = api.request("GET", f"/v1/{kind}", params={**params, **({"continue": token} if token else {})})
        if isinstance(body, list):  # a gateway from before pages: everything at once
            yield body
            return
        yield body["items"]
        token = body.get("continue") or ""
        if not token:
            return


def _emit_pages(pages: Iterator[list[dict[str, Any]]], output: str, kind: str) -> None:
    """Print each page as it arrives (one JSON list or YAML sequence in all; tables share a header)."""
    count = 0
    for items in pages:
        if not items:
            continue
        if output == "json":
            text = ",\n".join(json.dumps(i, indent=2) for i in items)
            sys.stdout.write(("[\n" if count == 0 else ",\n") + text)
        elif output == "yaml":
            sys.stdout.write(yaml.safe_dump(items, sort_keys=False))
        else:
            table = _workload_table(items) if kind == "workloads" else _node_table(items)
            table.show_header = count == 0
            out.print(table)
        sys.stdout.flush()
        count += len(items)
    if output == "json":
        sys.stdout.write("\n]\n" if count else "[]\n")
    elif output == "yaml" and not count:
        sys.stdout.write("[]\n")
    elif not count:
        out.print(f"No {kind} found.")


def _describe_workload(w: dict[str, Any]) -> str:
    res = w["spec"].get("resources", {})
    lines = [
        f"Name:           {w['name']}",
        f"Type:           {w['type']}",
        f"Labels:         {', '.join(f'{k}={v}' for k, v in w['labels'].items()) or '-'}",
        f"Desired state:  {w['desiredState']}",
        f"Phase:          {w['phase']}",
        f"Reason:         {w['reason'] or '-'}",
        f"Node:           {w['node'] or '-'}",
        f"Revision:       {w['revision']} (generation {w['generation']}, observed {w['observedRevision'] or '-'})",
        f"Runtime id:     {w['runtimeId'] or '-'}",
        f"Restarts:       {w['restarts']}",
        f"Resources:      cpu {res.get('cpuMillicores', 0)}m, memory {res.get('memoryMb', 0)} MiB, "
        f"disk {res.get('diskMb', 0)} MiB",
        f"Usage:          cpu {w['usage'].get('cpuPercent', 0):.1f}%, "
        f"memory {w['usage'].get('memoryBytes', 0) / 1048576:.1f} MiB",
    ]
    if w["message"]:
        label = "Why pending:" if w["phase"] == "Pending" else "Message:"
        lines.append(f"{label:<16}{w['message']}")
    for d in w.get("drift", []):
        lines.append(f"Drift:          {d['instance']}: {d['kind']}: {d['rule']}")
        lines.append(f"  remediation:  {d['action']}")
    placement = w.get("placement") or {}
    if placement.get("scores"):
        lines.append("Placement:")
        lines += _score_lines(placement)
    if w.get("replicas", 1) > 1:
        lines.append(f"Replicas:       {w['ready']} ready")
        for i in w.get("instances", []):
            why = f"  {i['reason']}" if i["phase"] != "Running" and i["reason"] else ""
            lines.append(f"  {i['instance']:<24} {i['phase']:<10} {i['node'] or '-'}{why}")
    return "\n".join(lines)


def _score_lines(decision: dict[str, Any]) -> list[str]:
    lines = []
    for s in decision.get("scores", [])[:5]:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in s.get("breakdown", {}).items())
        lines.append(f"  {s.get('node_id', '?'):<20} {s.get('total', 0):6.1f}  [{parts}]")
    return lines


def _describe_node(n: dict[str, Any]) -> str:
    caps, alloc, usage = n.get("capabilities", {}), n.get("allocated", {}), n.get("usage", {})
    taints = ", ".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in n.get("taints", []))
    rts = ", ".join(
        f"{k} {v.get('version', '')}".strip() + (f" [{', '.join(v['features'])}]" if v.get("features") else "")
        for k, v in sorted(caps.get("runtimes", {}).items())
    )
    return "\n".join([
        f"Name:           {n['id']}",
        f"Status:         {n['status']} ({n.get('statusReason', '')})" + (" cordoned" if n.get("cordoned") else ""),
        f"Address:        {n.get('address') or '-'}",
        f"Agent version:  {n.get('agentVersion', '')}",
        f"Runtimes:       {rts or '-'}",
        f"Storage:        {', '.join(caps.get('storageDrivers', [])) or '-'}",
        f"Labels:         {', '.join(f'{k}={v}' for k, v in n.get('labels', {}).items()) or '-'}",
        f"Taints:         {taints or '-'}",
        f"Capacity:       cpu {caps.get('cpuMillicores', 0)}m, memory {caps.get('memoryMb', 0)} MiB, "
        f"disk {caps.get('diskMb', 0)} MiB",
        f"Allocated:      cpu {alloc.get('cpuMillicores', 0)}m, memory {alloc.get('memoryMb', 0)} MiB, "
        f"disk {alloc.get('diskMb', 0)} MiB",
        f"Usage:          cpu {usage.get('cpuPercent', 0):.1f}%, memory {usage.get('memoryUsedMb', 0)} MiB",
        f"Last heartbeat: {_age(n.get('lastHeartbeat', 0))} ago",
        f"Workloads:      {', '.join(n.get('workloads', [])) or '-'}",
    ])


@app.command()
def describe(
    kind: str = typer.Argument(..., help="workload or node"),
    name: str = typer.Argument(..., help="Its name."),
    output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    """Show one workload or node in detail, including why a workload is Pending."""
    k = _kind(kind)
    api = Api(server)
    item = api.request("GET", f"/v1/{k}/{name}")
    if output == "text":
        text = _describe_workload(item) if k == "workloads" else _describe_node(item)
        out.print(printable(text, keep_newlines=True), markup=False, highlight=False)
        events = api.request("GET", "/v1/events", params={"limit": 10, "subject": f"{k[:-1]}/{name}"})
        if events:
            out.print("Events:", highlight=False)
            for e in events:
                out.print(printable(f"  {_age(e['ts']):>5} ago  {e['kind']:<18} {e['message']}"), markup=False,
                          highlight=False)
    else:
        emit(item, output)


@app.command()
def plan(
    files: list[Path] = typer.Option(..., "--filename", "-f", help="Manifest file (YAML or JSON; - for stdin)."),
    output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    """Dry run: show where workloads would be placed and why. Writes and reserves nothing."""
    api = Api(server)
    results = []
    for _source, doc in _read_manifest_files(files):
        r = api.request("POST", "/v1/plan", json=doc)
        results.append(r)
        if output != "text":
            continue
        for rep in r["replicas"]:
            target = rep["node"] or "nowhere (would stay Pending)"
            out.print(f"workload/{rep['instance']} -> {target}", highlight=False)
            out.print(f"  {rep['explanation']}", markup=False, highlight=False)
            out.print("\n".join(_score_lines(rep["decision"])), markup=False, highlight=False)
    if output != "text":
        emit(results, output)


@app.command()
def explain(
    name: str = typer.Argument(..., help="Workload name."),
    node: str = typer.Option("", "--node", help="Also show every filter's verdict and the scores for this node."),
    output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    """Explain why a workload went where it went, or why it went nowhere."""
    r = Api(server).request("GET", f"/v1/workloads/{name}/explain", params={"node": node} if node else None)
    if output != "text":
        emit(r, output)
        return
    for rep in r["replicas"]:
        where = rep["node"] or "no node"
        out.print(f"workload/{rep['instance']}: {rep['phase']} on {where}", highlight=False)
        out.print(f"  {rep['explanation'] or 'not evaluated yet'}", markup=False, highlight=False)
        lines = _score_lines(rep.get("decision") or {})
        if lines:
            out.print("  top candidates:\n" + "\n".join(lines), markup=False, highlight=False)
    ev = r.get("node")
    if ev:
        verdict = "feasible" if ev["feasible"] else "rejected"
        out.print(f"node/{ev['node_id']}: {verdict}", highlight=False)
        for f in ev["filters"]:
            mark = "pass" if f["passed"] else "FAIL"
            detail = "" if f["passed"] else f"  {f['message']}"
            out.print(f"  {mark:<5}{f['filter']}{detail}", markup=False, highlight=False)
        if ev["feasible"]:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in ev["breakdown"].items())
            out.print(f"  score {ev['total']:.1f} [{parts}]", markup=False, highlight=False)


@app.command()
def delete(
    kind: str | None = typer.Argument(None, help="workload or node"),
    name: str | None = typer.Argument(None, help="Its name."),
    files: list[Path] | None = typer.Option(None, "--filename", "-f", help="Delete what these manifests define."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the workload is gone from its node."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait with --wait."),
    force: bool = typer.Option(False, "--force", help="Nodes: delete even with instances assigned (they are "
                               "withdrawn and placed elsewhere)."),
    server: str | None = ServerOpt,
) -> None:
    """Delete workloads, or a node (`delete node NODE`: refused while instances are assigned to it
    unless it is drained or --force is given). Idempotent: deleting what is gone is not an error."""
    names: list[str] = []
    if files:
        names = [doc["metadata"]["name"] for _s, doc in _read_manifest_files(files)]
    elif kind and name:
        if _kind(kind) == "nodes":
            _delete_node(name, force, server)
            return
        names = [name]
    else:
        fail("give `workload NAME` or -f FILE")
    api = Api(server)
    for n in names:
        r = api.request("DELETE", f"/v1/workloads/{n}")
        if r["alreadyGone"]:
            out.print(f"workload/{n} already gone", highlight=False)
            continue
        if not wait:
            out.print(f"workload/{n} deletion requested", highlight=False)
            continue
        deadline = time.monotonic() + timeout
        with err_console.status(f"deleting workload/{n} ..."):
            while time.monotonic() < deadline:
                try:
                    api.request("GET", f"/v1/workloads/{n}")
                except CtlError:
                    break
                time.sleep(0.25)
            else:
                fail(f"workload/{n} is still being deleted after {timeout:.0f}s "
                     f"(see `persysctl describe workload {n}`)")
        out.print(f"workload/{n} deleted", highlight=False)


def _delete_node(node: str, force: bool, server: str | None) -> None:
    r = Api(server).request("DELETE", f"/v1/nodes/{node}", missing_ok=True, params={"force": str(force).lower()})
    if r is None:
        out.print(f"node/{node} already gone (no such node)", highlight=False)
        return
    moved = f"; {len(r['withdrawn'])} instance(s) withdrawn to be placed elsewhere" if r["withdrawn"] else ""
    out.print(f"node/{node} deleted{moved}", highlight=False)
    out.print("an agent still running there joins again as a new node: stop it to keep the node out",
              highlight=False)


@app.command()
def events(
    subject: str = typer.Option("", "--for", help="Only events about this subject, e.g. workload/web."),
    limit: int = typer.Option(50, "--limit", help="How many, newest last."),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    """Show recent cluster events (NodeJoined, WorkloadScheduled, WorkloadFailed, ...)."""
    items = Api(server).request("GET", "/v1/events", params={"limit": limit, "subject": subject})
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("AGE", "KIND", "SUBJECT", "MESSAGE"):
        t.add_column(col, overflow="fold")
    for e in items:
        t.add_row(_age(e["ts"]), e["kind"], e["subject"], e["message"])
    emit(items, output, t)


@app.command()
def health(output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """Show the control plane's health and operating mode."""
    h = Api(server).request("GET", "/v1/health")
    t = Table(box=None, show_header=False, pad_edge=False)
    for k, v in h.items():
        if k == "liveness":
            t.add_row(k, _liveness_line(v))
            continue
        t.add_row(k, ", ".join(f"{kk} {vv}" for kk, vv in v.items()) if isinstance(v, dict) else str(v))
    emit(h, output, t)


def _liveness_line(g: dict[str, Any]) -> str:
    if not g.get("suspended"):
        return f"judging {g.get('judgedNodes', 0)} nodes ({g.get('silentNodes', 0)} silent)"
    return (f"SUSPENDED for {_age(g['since'])} ({g['reason']}): {g['silentNodes']} of {g['judgedNodes']} nodes "
            f"silent, not marked NotReady; ends in {max(0, int(g['endsAt'] - time.time()))}s at the latest "
            "(persysctl admin liveness resume ends it now)")


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _control(name: str, action: str, server: str | None) -> None:
    w = Api(server).request("POST", f"/v1/workloads/{name}/{action}")
    out.print(f"workload/{name} {action} requested (revision {w['revision']})", highlight=False)


@app.command()
def start(name: str = typer.Argument(..., help="Workload name."), server: str | None = ServerOpt) -> None:
    """Set a workload's desired state to Running."""
    _control(name, "start", server)


@app.command()
def stop(name: str = typer.Argument(..., help="Workload name."), server: str | None = ServerOpt) -> None:
    """Set a workload's desired state to Stopped: its instances stop but stay placed."""
    _control(name, "stop", server)


@app.command()
def restart(name: str = typer.Argument(..., help="Workload name."), server: str | None = ServerOpt) -> None:
    """Replace every instance of a workload with a fresh copy of the same spec."""
    _control(name, "restart", server)


@app.command()
def logs(
    name: str = typer.Argument(..., help="Workload name."),
    instance: str = typer.Option("", "--instance", help="Replica instance (default: the first), e.g. web.1."),
    tail: int = typer.Option(100, "--tail", "-n", help="Lines from the end."),
    server: str | None = ServerOpt,
) -> None:
    """Show a workload's output: container logs, compose services, a VM's serial console, a process."""
    r = Api(server).request("GET", f"/v1/workloads/{name}/logs", params={"instance": instance, "tail": tail})
    sys.stdout.write(r["text"] if r["text"].endswith("\n") or not r["text"] else r["text"] + "\n")


@app.command()
def top(
    kind: str = typer.Argument("workloads", help="workloads or nodes"),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    """Live resource usage as last reported by the agents (CPU, memory, disk and network I/O)."""
    k = _kind(kind)
    items = Api(server).request("GET", f"/v1/{k}")
    t = Table(box=None, header_style="bold", pad_edge=False)
    if k == "workloads":
        for col in ("NAME", "TYPE", "READY", "NODE", "CPU%", "MEMORY", "DISK READ", "DISK WRITE", "NET RX", "NET TX"):
            t.add_column(col, justify="right" if col not in ("NAME", "TYPE", "NODE") else "left")
        rows = [{"name": w["name"], "type": w["type"], "ready": w["ready"], "node": ",".join(w["nodes"]) or "-",
                 **w["usage"]} for w in items]
        for r in rows:
            t.add_row(r["name"], r["type"], r["ready"], r["node"], f"{r['cpuPercent']:.1f}", _bytes(r["memoryBytes"]),
                      _bytes(r["diskReadBytes"]), _bytes(r["diskWriteBytes"]), _bytes(r["netRxBytes"]),
                      _bytes(r["netTxBytes"]))
    else:
        for col in ("NAME", "STATUS", "CPU%", "MEMORY USED", "WORKLOADS"):
            t.add_column(col)
        rows = [{"name": n["id"], "status": n["status"], **n.get("usage", {})} for n in items]
        for r in rows:
            t.add_row(r["name"], r["status"], f"{r.get('cpuPercent', 0):.1f}", f"{r.get('memoryUsedMb', 0)} MiB",
                      str(r.get("workloads", 0)))
    emit(rows, output, t)


IMAGE_KINDS = ("docker", "rootfs", "disk", "kernel", "initrd")
image_app = typer.Typer(help="Put images on nodes without a registry.", no_args_is_help=True)
app.add_typer(image_app, name="image")


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
        with err_console.status(f"loading {file.name} ({_bytes(size)}) onto node/{n} ..."), file.open("rb") as f:
            r = api.request("POST", f"/v1/nodes/{n}/images", params={"kind": kind, "name": name}, content=f,
                            headers={"content-type": "application/octet-stream", "content-length": str(size)})
        out.print(f"node/{n}: {r['detail']}", highlight=False)


def _node_kind(kind: str) -> None:
    if _kind(kind) != "nodes":
        fail("only nodes can be labelled or tainted")


@app.command()
def cordon(node: str = typer.Argument(..., help="Node name."), server: str | None = ServerOpt) -> None:
    """Stop placing new workloads on a node; what runs there keeps running."""
    Api(server).request("POST", f"/v1/nodes/{node}/cordon")
    out.print(f"node/{node} cordoned", highlight=False)


@app.command()
def uncordon(node: str = typer.Argument(..., help="Node name."), server: str | None = ServerOpt) -> None:
    """Allow placements on a node again (also ends a drain)."""
    Api(server).request("POST", f"/v1/nodes/{node}/uncordon")
    out.print(f"node/{node} uncordoned", highlight=False)


@app.command()
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


@app.command()
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
    out.print(f"node/{node} labelled", highlight=False)


@app.command()
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
    out.print(f"node/{node} tainted", highlight=False)


admin_app = typer.Typer(help="Back up, restore and recover the control plane's state.", no_args_is_help=True)
app.add_typer(admin_app, name="admin")
app.add_typer(policy_app, name="policy")


@admin_app.command("backup")
def admin_backup(
    out_file: Path = typer.Option(None, "--output-file", "-o", help="Write here (default: standard output)."),
    server: str | None = ServerOpt,
) -> None:
    """Save every durable key, read at one revision, as JSON."""
    doc = Api(server).request("GET", "/v1/admin/backup")
    text = json.dumps(doc, indent=1)
    if out_file is None:
        print(text)
        return
    out_file.write_text(text + "\n")
    err_console.print(f"backup of revision {doc['revision']} ({len(doc['items'])} keys) written to {out_file}",
                      highlight=False)


@admin_app.command("restore")
def admin_restore(
    file: Path = typer.Option(None, "--filename", "-f", help="A backup written by `persysctl admin backup`."),
    latest: bool = typer.Option(False, "--latest", help="Restore the scheduler's own rolling backup."),
    force: bool = typer.Option(False, "--force", help="Restore even outside recovery mode (overwrites state)."),
    server: str | None = ServerOpt,
) -> None:
    """Restore a backup. Allowed in recovery mode; anywhere else only with --force."""
    if (file is None) == (not latest):
        fail("give exactly one of -f FILE or --latest")
    api = Api(server)
    params = {"force": str(force).lower(), "latest": str(latest).lower()}
    if latest:
        r = api.request("POST", "/v1/admin/restore", params=params)
    else:
        assert file is not None
        if not file.exists():
            fail(f"{file}: no such file")
        try:
            doc = json.loads(file.read_text())
        except ValueError as e:
            fail(f"{file}: not a JSON backup ({e})")
        r = api.request("POST", "/v1/admin/restore", params=params, json=doc)
    out.print(f"restored {r['restored']} keys; cluster {r['clusterId']} is back in normal mode", highlight=False)


liveness_app = typer.Typer(help="The mass-loss guard of node liveness.", no_args_is_help=True)
admin_app.add_typer(liveness_app, name="liveness")


@liveness_app.command("resume")
def admin_liveness_resume(server: str | None = ServerOpt) -> None:
    """End a liveness suspension now: nodes silent past their grace period are marked NotReady
    and their work is placed elsewhere (the guard suspends liveness when most nodes go silent
    at once, and ends on its own when heartbeats flow again or after its time limit)."""
    r = Api(server).request("POST", "/v1/admin/liveness/resume")
    for rep in r["replicas"]:
        if "error" in rep:
            out.print(f"replica at {rep['target']}: unreachable ({rep['error']})", highlight=False)
        elif rep["resumed"]:
            out.print(f"replica {rep['replicaId']}: liveness resumed; {rep['silentNodes']} of "
                      f"{rep['judgedNodes']} nodes were silent", highlight=False)
        else:
            out.print(f"replica {rep['replicaId']}: liveness was not suspended", highlight=False)


@admin_app.command("recover")
def admin_recover(
    confirm_empty: bool = typer.Option(False, "--confirm-empty",
                                       help="Accept the state store's current (possibly empty) contents."),
    server: str | None = ServerOpt,
) -> None:
    """Leave recovery mode without a backup: agents then remove what the store does not list."""
    if not confirm_empty:
        fail("this accepts the state store as it is now, and agents will stop workloads it does not list: "
             "re-run with --confirm-empty, or restore a backup with `persysctl admin restore`")
    r = Api(server).request("POST", "/v1/admin/recover")
    out.print(f"cluster {r['clusterId']} is in normal mode with {r['workloads']} workloads", highlight=False)


app.add_typer(auth_app, name="auth")
app.command("audit")(audit_command)


@app.callback()
def _credentials(token: str = typer.Option(None, "--token", envvar="PERSYS_TOKEN", show_envvar=True,
                                           help="A bearer API token, instead of the configured certificate.")
                 ) -> None:
    Api.token = token or None


def main() -> None:
    try:
        app()
    except CtlError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # a bug must still end in one line, not a traceback
        err_console.print(f"error: unexpected {type(e).__name__}: {e} (please report this)", markup=False,
                          highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
