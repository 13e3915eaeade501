"""persysctl: the Persys command-line client (talks to the REST gateway over mutual TLS).

The command tree: `get`, `delete` and the workload controls here; `apply` (apply_cmd),
`describe`, `plan`, `explain` (inspect_cmds), `health` and `top` (status_cmds) and the resource
groups (auth, node, policy, secret, admin...) live in their own modules and are registered here,
in the order `persysctl --help` lists them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.table import Table
from rich.text import Text

from persys.cli.ctl import (
    apply_cmd,
    automation_cmds,
    bucket_cmds,
    events_cmd,
    exec_cmds,
    follow,
    inspect_cmds,
    intel_cmds,
    logs_cmd,
    meter_cmds,
    move_cmd,
    node_cmds,
    object_cmds,
    rollout_cmds,
    secret_cmds,
    status_cmds,
    volume_cmds,
)
from persys.cli.ctl import tracing as ctl_tracing
from persys.cli.ctl.admin_cmds import admin_app
from persys.cli.ctl.api import (
    Api,
    CtlError,
    OutputOpt,
    ServerOpt,
    check_output,
    emit,
    err_console,
    fail,
    name_line,
    object_ref,
    out,
    resource_kind,
    write_jsonpath,
)
from persys.cli.ctl.apply_cmd import read_manifest_files
from persys.cli.ctl.auth_cmds import audit_command, auth_app
from persys.cli.ctl.config_cmds import config_app
from persys.cli.ctl.join_cmds import node_app
from persys.cli.ctl.policy_cmd import policy_app
from persys.cli.output import listing_rows
from persys.cli.output.printed_doc import printed
from persys.cli.output.safe_text import cell
from persys.cli.version import version_option
from persys.model.label_selector import Selector, SelectorError
from persys.model.label_selector import parse as parse_selector

app = typer.Typer(
    name="persysctl",
    help=(
        "Control a Persys cluster.\n\n"
        "Examples:\n\n"
        "  persysctl apply -f examples/hello-process.yaml\n\n"
        "  persysctl get workloads\n\n"
        "  persysctl describe workload hello-process\n\n"
        "  persysctl delete workload hello-process\n\n"
        "  persysctl apply -f secret.yaml   (kind: Secret; then persysctl get secrets)\n\n"
        "The cluster is read from $PERSYS_CONFIG or ~/.persys/config.yaml (written by `persys dev`).\n\n"
        "Shell completion (bash, zsh, fish): persysctl --install-completion"
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

def _rows_table(kind: str, items: list[dict[str, Any]], wide: bool) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in listing_rows.columns(kind, wide):
        t.add_column(col, overflow="fold")
    for item in items:
        t.add_row(*map(Text, listing_rows.row(kind, item, wide)))  # printable already; Text: never markup
    return t


def _table(kind: str, items: list[dict[str, Any]], wide: bool = False) -> Table:
    return _rows_table(kind, items, wide)


# --------------------------------------------------------------------------- commands

app.command()(apply_cmd.apply)


LabelOpt = typer.Option("", "--selector", "-l", help="Only objects whose labels match: key=value, key!=value, "
                        "'key in (a,b)', 'key notin (a,b)', key, !key; commas join requirements (all must hold).")


def _selector(text: str) -> Selector:
    try:
        return parse_selector(text)
    except SelectorError as err:
        fail(f"-l: {err}")


@app.command()
def get(
    kind: str = typer.Argument(..., help="workloads, nodes, secrets, volumes or buckets"),
    name: str | None = typer.Argument(None, help="Only this one."),
    node: str = typer.Option("", "--node", help="Workloads on this node only."),
    selector: str = LabelOpt,
    chunk_size: int = typer.Option(500, "--chunk-size", min=1, max=5000,
                                   help="Items asked for per request; pages are printed as they arrive."),
    watch: bool = typer.Option(False, "--watch", "-w", help="After the list, print a row per change (added, "
                               "modified, deleted) until Ctrl-C."),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    """List workloads, nodes, secrets, volumes or buckets (secrets: names, keys, versions; never values).

    Examples: `persysctl get workloads -l app=web -o wide`, `persysctl get nodes -o name`,
    `persysctl get workloads -o jsonpath='{range .items[*]}{.name}{"\\t"}{.phase}{"\\n"}{end}'`.
    With -w, follow changes: `persysctl get workloads -w`, `persysctl get nodes -w`. One object
    also as `persysctl get workload/web` (what -o name prints); -o json|yaml then prints the object."""
    ref_kind, name = object_ref(kind, name)
    k = resource_kind(ref_kind or kind)
    check_output(output)
    sel = _selector(selector)
    if sel and k not in ("workloads", "nodes"):
        fail("-l selects workloads and nodes by their labels; secrets, volumes and buckets have none here")
    api = Api(server)
    if k in _OTHER_LISTS:
        lister, changes = _OTHER_LISTS[k]
        if watch:
            fail(f"-w follows workloads and nodes; {k} change through {changes}")
        lister(api, name, output)
        return
    if watch:
        follow.follow_objects(api, k, {"node": node} if node and k == "workloads" else {},
                              _change_row(k, name, sel))
        return
    if not name:
        pages = _pages(api, k, node if k == "workloads" else "", chunk_size)
        _emit_pages((_matching(p, sel) for p in pages) if sel else pages, output, k)
        return
    items = _matching([api.request("GET", f"/v1/{k}/{name}")], sel)
    # One object asked for by name prints as that object, as kubectl does (not a list of one).
    emit(items[0] if items else items, output, _table(k, items), wide=_table(k, items, wide=True), kind=k[:-1])


# The kinds `get` hands to their own modules: the lister, and where their changes are followed
# instead of -w.
_OTHER_LISTS: dict[str, tuple[Callable[[Api, str | None, str], None], str]] = {
    "secrets": (secret_cmds.get_secrets, "`persysctl events --kind SecretChanged -f`"),
    "volumes": (volume_cmds.get_volumes, "`persysctl events -f` (Volume* events)"),
    "buckets": (bucket_cmds.get_buckets, "`persysctl events -f` (Bucket* events)"),
    "policies": (automation_cmds.get_policies, "`persysctl events -f` (Policy* events)"),
}


def _matching(items: list[dict[str, Any]], sel: Selector) -> list[dict[str, Any]]:
    """The items the selector picks (by their labels; a node's include what operators set)."""
    return [i for i in items if sel.matches(i.get("labels"))] if sel else items


def _change_row(kind: str, only: str | None, sel: Selector | None = None) -> Any:
    """Print one change as a table row (the first with the header), as `get` shows it; a deletion
    as `DELETED <kind>/<id>`. With a selector, only objects it picks."""
    header = listing_rows.columns(kind, False)
    widths: list[int] = []  # empty until the header is printed; then the running column widths

    def show(change: str, item: dict[str, Any]) -> None:
        nonlocal widths
        if only and item.get("id") != only:
            return
        if sel and not sel.matches(item.get("labels")):
            return
        if change == "DELETED":
            out.print(f"DELETED  {kind[:-1]}/{cell(item['id'])}", markup=False, highlight=False)
            return
        if not widths:
            line, widths = listing_rows.watch_line(header, list(header), widths)
            out.print(Text(line, style="bold"))
        line, widths = listing_rows.watch_line(header, listing_rows.row(kind, item, False), widths)
        out.print(Text(line), overflow="ignore", crop=False)

    return show


def _pages(api: Api, kind: str, node: str, chunk: int) -> Iterator[list[dict[str, Any]]]:
    return listing_rows.pages(lambda path, query: api.request("GET", path, params=query), kind, node, chunk)


def _emit_pages(pages: Iterator[list[dict[str, Any]]], output: str, kind: str) -> None:
    """Print each page as it arrives (one JSON list or YAML sequence in all; tables share a header;
    names a line each). jsonpath needs the whole list: it is rendered once the last page is in."""
    count = 0
    whole: list[dict[str, Any]] = []
    for items in pages:
        if not items:
            continue
        if output in ("json", "yaml") or output.startswith("jsonpath="):
            items = printed(items)  # RFC 3339 times, camelCase keys
        if output.startswith("jsonpath="):
            whole += items
        else:
            _write_page(items, output, kind, first=count == 0)
        sys.stdout.flush()
        count += len(items)
    _write_end(output, kind, count, whole)


def _write_page(items: list[dict[str, Any]], output: str, kind: str, first: bool) -> None:
    """One page as -o json, yaml, name or a table (the first page's with the header)."""
    if output == "json":
        text = ",\n".join(json.dumps(i, indent=2) for i in items)
        sys.stdout.write(("[\n" if first else ",\n") + text)
    elif output == "yaml":
        sys.stdout.write(yaml.safe_dump(items, sort_keys=False))
    elif output == "name":
        sys.stdout.write("".join(name_line(kind[:-1], i) + "\n" for i in items))
    else:
        table = _table(kind, items, wide=output == "wide")
        table.show_header = first
        out.print(table)


def _write_end(output: str, kind: str, count: int, whole: list[dict[str, Any]]) -> None:
    """What follows the last page: the JSON list's end, an empty list, the jsonpath rendering or
    `No workloads found.`"""
    if output == "json":
        sys.stdout.write("\n]\n" if count else "[]\n")
    elif output == "yaml" and not count:
        sys.stdout.write("[]\n")
    elif output.startswith("jsonpath="):
        write_jsonpath(output, {"items": whole})
    elif not count and output != "name":
        out.print(f"No {kind} found.")


app.command()(inspect_cmds.describe)


app.command()(inspect_cmds.plan)


app.command()(inspect_cmds.explain)


@app.command()
def delete(
    kind: str | None = typer.Argument(None, help="workload, node, secret or volume"),
    name: str | None = typer.Argument(None, help="Its name."),
    files: list[Path] | None = typer.Option(None, "--filename", "-f", help="Delete what these manifests define."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the workload is gone from its node."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait with --wait."),
    force: bool = typer.Option(False, "--force", help="Nodes: delete even with instances assigned (they are "
                               "withdrawn and placed elsewhere)."),
    selector: str = LabelOpt,
    server: str | None = ServerOpt,
) -> None:
    """Delete workloads, or a node (`delete node NODE`: refused while instances are assigned to it
    unless it is drained or --force is given). Idempotent: deleting what is gone is not an error.

    By labels: `persysctl delete workloads -l app=web` deletes every workload the selector picks
    (listed first, then one by one)."""
    names: list[str] = []
    kind, name = object_ref(kind, name)
    sel = _selector(selector)
    if sel:
        if name or files or (kind and resource_kind(kind) != "workloads"):
            fail("-l deletes workloads by their labels: give `delete workloads -l SELECTOR` alone")
        names = [w["id"] for page in _pages(Api(server), "workloads", "", 500) for w in _matching(page, sel)]
        if not names:
            out.print(f"No workloads match {selector!r}.", highlight=False)
            return
    elif files:
        names = [doc["metadata"]["name"] for _s, doc in read_manifest_files(files)]
    elif kind and name:
        if resource_kind(kind) != "workloads":
            _delete_other(resource_kind(kind), name, force, server)
            return
        names = [name]
    else:
        fail("give `workload NAME`, -f FILE or `workloads -l SELECTOR`")
    _delete_workloads(Api(server), names, wait, timeout)


def _delete_other(kind: str, name: str, force: bool, server: str | None) -> None:
    """`delete KIND NAME` of anything but a workload: each kind's own module does it."""
    if kind == "nodes":
        _delete_node(name, force, server)
    elif kind == "secrets":
        secret_cmds.delete_secret(Api(server), name)
    elif kind == "volumes":
        volume_cmds.delete_volume(Api(server), name)
    elif kind == "policies":
        automation_cmds.delete_policy(Api(server), name)
    elif kind == "buckets":
        r = Api(server).request("DELETE", f"/v1/buckets/{name}", params={"purge": "false"})
        out.print(f"bucket/{name} {'already gone' if r['alreadyGone'] else 'deleted'}", highlight=False)


def _delete_workloads(api: Api, names: list[str], wait: bool, timeout: float) -> None:
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


app.command()(status_cmds.health)


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


app.command()(status_cmds.top)


node_cmds.register(app)
app.command("move")(move_cmd.move)
app.add_typer(admin_app, name="admin")
app.add_typer(meter_cmds.meter_app, name="meter")
app.add_typer(policy_app, name="policy")
app.add_typer(rollout_cmds.rollout_app, name="rollout")
app.add_typer(auth_app, name="auth")
app.add_typer(secret_cmds.secret_app, name="secret")
app.add_typer(volume_cmds.volume_app, name="volume")
app.add_typer(bucket_cmds.bucket_app, name="bucket")
app.add_typer(automation_cmds.automation_app, name="automation")
app.add_typer(object_cmds.object_app, name="object")
app.add_typer(node_app, name="node")
app.add_typer(config_app, name="config")
app.command("audit")(audit_command)
app.command("exec", help=exec_cmds.EXEC_HELP, no_args_is_help=True)(exec_cmds.exec_command)
app.command("cp", help=exec_cmds.CP_HELP, no_args_is_help=True)(exec_cmds.cp_command)
app.command("console", help=exec_cmds.CONSOLE_HELP, no_args_is_help=True)(exec_cmds.console_command)
app.command("events", help=events_cmd.HELP)(events_cmd.events_command)
app.command("logs", help=logs_cmd.HELP)(logs_cmd.logs_command)
intel_cmds.register(app)


@app.callback()
def _credentials(token: str = typer.Option(None, "--token", envvar="PERSYS_TOKEN", show_envvar=True,
                                           help="A bearer API token, instead of the configured certificate."),
                 context: str = typer.Option(None, "--context", envvar="PERSYS_CONTEXT", show_envvar=True,
                                             help="The configuration's context to use for this command "
                                                  "(persysctl config get-contexts)."),
                 server: str = typer.Option(None, "--server", help="Gateway URL, overriding the context's."),
                 _version: bool = version_option("persysctl"),
                 ) -> None:
    Api.token = token or None
    Api.context = context or None
    Api.server = server or None


def _command_names() -> set[str]:
    return {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands} | \
        {g.name or "" for g in app.registered_groups}


def main() -> None:
    try:
        with ctl_tracing.traced_command(sys.argv[1:], _command_names()):
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
