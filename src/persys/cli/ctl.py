"""persysctl: the Persys command-line client (talks to the REST gateway over mutual TLS).

Just over 500 lines: the core verbs (apply, get, describe, delete, logs, plan) stay together;
resource groups (auth, certs, node, policy, secret, admin) live in their own `*_cmds` modules.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml
from rich.table import Table
from rich.text import Text

from persys.cli import (
    apply_wait,
    automation_cmds,
    bucket_cmds,
    ctl_tracing,
    events_cmd,
    exec_cmds,
    follow,
    intel_cmds,
    listing_rows,
    logs_cmd,
    meter_cmds,
    move_cmd,
    node_cmds,
    object_cmds,
    replay_cmds,
    rollout_cmds,
    secret_cmds,
    usage_rows,
    volume_cmds,
    whatif_cmds,
)
from persys.cli.admin_cmds import admin_app
from persys.cli.api import (
    Api,
    CtlError,
    OutputOpt,
    ServerOpt,
    age_text,
    check_output,
    emit,
    err_console,
    fail,
    name_line,
    object_ref,
    out,
    resource_kind,
    scalar_text,
    write_jsonpath,
)
from persys.cli.auth_cmds import audit_command, auth_app
from persys.cli.config_cmds import config_app
from persys.cli.describe_text import node_text, reason_lines, score_lines, workload_text
from persys.cli.join_cmds import node_app
from persys.cli.policy_cmd import policy_app
from persys.cli.printed_doc import printed
from persys.cli.safe_text import cell, printable
from persys.cli.version import version_option
from persys.cli.views import as_manifests
from persys.model.label_selector import Selector, SelectorError
from persys.model.label_selector import parse as parse_selector
from persys.model.limits import BATCH_MAX_BYTES, MANIFEST_MAX_BYTES, human_bytes

if TYPE_CHECKING:  # the models load only for the commands that read manifests (startup time)
    from persys.model.automation import PolicyManifest
    from persys.model.bucket import BucketManifest
    from persys.model.secret import SecretManifest
    from persys.model.volume import VolumeManifest

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


def _read_manifest_files(files: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    return _read_files(files).docs


def _expand_dirs(files: list[Path]) -> list[Path]:
    """A folder stands for its manifests (*.yaml, *.yml, *.json, not recursive, in name order), as
    with kubectl; an empty one is an error rather than a silent no-op."""
    out: list[Path] = []
    for f in files:
        if str(f) != "-" and f.is_dir():
            found = sorted(p for p in f.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
            if not found:
                fail(f"{f}: a folder with no *.yaml, *.yml or *.json manifest")
            out += found
        else:
            out.append(f)
    return out


@dataclass
class _Files:
    docs: list[tuple[str, dict[str, Any]]]  # workload manifests, as documents to send
    secrets: list[SecretManifest]
    volumes: list[VolumeManifest]
    buckets: list[BucketManifest]
    policies: list[PolicyManifest] = field(default_factory=list)


def _read_files(files: list[Path]) -> _Files:
    """Workload manifests and the `kind: Secret` and `kind: Volume` documents of the files."""
    from persys.model.kinds import parse_documents
    from persys.model.manifest import ManifestError, load_documents

    docs: list[tuple[str, dict[str, Any]]] = []
    secrets: list[SecretManifest] = []
    volumes: list[VolumeManifest] = []
    buckets: list[BucketManifest] = []
    policies: list[PolicyManifest] = []
    for f in _expand_dirs(files):
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
            # What `get -o yaml|json` printed reads as the manifests it shows (persys.cli.views).
            found = parse_documents(as_manifests(load_documents(text, source)), source)
            secrets += found.secrets
            volumes += found.volumes
            buckets += found.buckets
            policies += found.policies
            for m in found.workloads:
                doc = m.model_dump(mode="json", by_alias=True, exclude_unset=True)
                if len(json.dumps(doc)) > MANIFEST_MAX_BYTES:
                    fail(f"{source}: manifest {m.metadata.name} is larger than {human_bytes(MANIFEST_MAX_BYTES)}")
                docs.append((source, doc))
        except ManifestError as e:
            fail(f"{source}: invalid manifest: " + "; ".join(e.problems))
    return _Files(docs, secrets, volumes, buckets, policies)


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
    files: list[Path] = typer.Option(..., "--filename", "-f", help="Manifest file (YAML or JSON; - for stdin) "
                                      "or a folder of them (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and show what would change; write nothing."),
    output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print the trace id of the apply (on stderr "
                                 "with -o json/yaml): find its spans in your tracing backend, and its events with "
                                 "`persysctl events -o json` (fields.traceId). Needs a gateway run with "
                                 "--otlp-endpoint."),
    wait: bool = typer.Option(False, "--wait", help="Then wait until every applied workload is Running (all "
                              "replicas), printing progress on stderr; exit 1 with one line per workload that is "
                              "not (its phase and reason) when one fails for good or at --timeout."),
    timeout: float = typer.Option(120, "--timeout", min=1, help="Seconds --wait waits at most."),
    settle: float = typer.Option(apply_wait.SETTLE_S, "--settle", min=0, max=3600,
                                 help="With --wait: seconds every replica must stay Running with no restart "
                                 "(a crash loop is Running between exits)."),
    server: str | None = ServerOpt,
) -> None:
    """Create or update workloads, secrets, volumes and buckets (`kind: Secret`, `kind: Volume` and
    `kind: Bucket`, applied first, so workloads can use them) from manifests. Idempotent: applying
    twice changes nothing. With --wait, returns once they run (CI: `apply -f app.yaml --wait`)."""
    found = _read_files(files)
    docs = found.docs
    api = Api(server)
    secret_results = secret_cmds.apply_secrets(api, found.secrets, dry_run) if found.secrets else []
    secret_results += volume_cmds.apply_volumes(api, found.volumes, dry_run) if found.volumes else []
    secret_results += bucket_cmds.apply_buckets(api, found.buckets, dry_run) if found.buckets else []
    secret_results += automation_cmds.apply_policies(api, found.policies, dry_run) if found.policies else []
    results: list[dict[str, Any]] = []
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
        emit(secret_results + results, output)
    if verbose:
        _print_trace(api.trace_id or ctl_tracing.trace_id(), output)
    if wait and not dry_run and results:
        not_running = apply_wait.wait_running(api, [r["id"] for r in results], timeout, settle)
        for line in not_running:
            err_console.print(line, markup=False, highlight=False)
        if not_running:
            raise typer.Exit(1)


def _print_trace(trace_id: str, output: str) -> None:
    line = f"trace {trace_id}" if trace_id else "trace: none (the gateway does not trace: see --otlp-endpoint)"
    (out if output == "text" else err_console).print(line, markup=False, highlight=False)


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
    if k == "secrets":
        if watch:
            fail("-w follows workloads and nodes; secrets change through `persysctl events --kind SecretChanged -f`")
        secret_cmds.get_secrets(api, name, output)
        return
    if k == "volumes":
        if watch:
            fail("-w follows workloads and nodes; volumes change through `persysctl events -f` (Volume* events)")
        volume_cmds.get_volumes(api, name, output)
        return
    if k == "buckets":
        if watch:
            fail("-w follows workloads and nodes; buckets change through `persysctl events -f` (Bucket* events)")
        bucket_cmds.get_buckets(api, name, output)
        return
    if k == "policies":
        if watch:
            fail("-w follows workloads and nodes; policies change through `persysctl events -f` (Policy* events)")
        automation_cmds.get_policies(api, name, output)
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
        if output == "json":
            text = ",\n".join(json.dumps(i, indent=2) for i in items)
            sys.stdout.write(("[\n" if count == 0 else ",\n") + text)
        elif output == "yaml":
            sys.stdout.write(yaml.safe_dump(items, sort_keys=False))
        elif output == "name":
            sys.stdout.write("".join(name_line(kind[:-1], i) + "\n" for i in items))
        elif output.startswith("jsonpath="):
            whole += items
        else:
            table = _table(kind, items, wide=output == "wide")
            table.show_header = count == 0
            out.print(table)
        sys.stdout.flush()
        count += len(items)
    if output == "json":
        sys.stdout.write("\n]\n" if count else "[]\n")
    elif output == "yaml" and not count:
        sys.stdout.write("[]\n")
    elif output.startswith("jsonpath="):
        write_jsonpath(output, {"items": whole})
    elif not count and output != "name":
        out.print(f"No {kind} found.")


@app.command()
def describe(
    kind: str = typer.Argument(..., help="workload, node, secret, volume or bucket (or KIND/NAME)"),
    name_arg: str | None = typer.Argument(None, metavar="NAME", help="Its name."),
    output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    """Show one workload, node, secret, volume or bucket in detail, including why a workload is Pending.

    `persysctl describe workload web` or `persysctl describe workload/web` (what -o name prints)."""
    ref_kind, ref_name = object_ref(kind, name_arg)
    if not ref_name:
        fail(f"give the {kind}'s name: `persysctl describe {kind} NAME` or `{kind}/NAME`")
    name = ref_name
    k = resource_kind(ref_kind or kind)
    api = Api(server)
    if k == "volumes":
        volume_cmds.describe_volume(api, name, output)
        return
    if k == "secrets":
        secret_cmds.describe_secret(api, name, output)
        return
    if k == "buckets":
        bucket_cmds.describe_bucket(api, name, output)
        return
    if k == "policies":
        automation_cmds.describe_policy(api, name, output)
        return
    item = api.request("GET", f"/v1/{k}/{name}")
    if output == "text":
        text = workload_text(item) if k == "workloads" else node_text(item)
        out.print(printable(text, keep_newlines=True), markup=False, highlight=False)
        events = api.request("GET", "/v1/events", params={"limit": 10, "subject": f"{k[:-1]}/{name}"})
        if events:
            out.print("Events:", highlight=False)
            for e in events:
                out.print(printable(f"  {age_text(e['ts']):>5} ago  {e['kind']:<18} {e['message']}"), markup=False,
                          highlight=False)
    else:
        emit(item, output)


@app.command()
def plan(
    files: list[Path] = typer.Option(None, "--filename", "-f", help="Manifest file (YAML or JSON; - for stdin) "
                                     "or a folder of them (repeatable)."),
    drain: list[str] = typer.Option(None, "--drain", help="What if NODE were drained (repeatable)."),
    cordon: list[str] = typer.Option(None, "--cordon", help="What if NODE were cordoned (repeatable)."),
    lose_node: list[str] = typer.Option(None, "--lose-node", help="What if NODE were lost (repeatable)."),
    lose_label: str = typer.Option("", "--lose-label", help="What if every node labelled key=value were lost."),
    add_node: Path | None = typer.Option(None, "--add-node", help="What if the nodes of this file joined (the "
                                         "`persys dev --nodes` format: name, labels, taints, cpuMillicores, "
                                         "memoryMb, diskMb, runtimes, storageDrivers)."),
    output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    """Dry run: where workloads would be placed and why (-f), or what an operation would do:
    where every instance it affects would go, what would stay Pending and why (--drain, --cordon,
    --lose-node, --lose-label, --add-node). Decided by the real engine on the current cluster;
    writes and reserves nothing."""
    api = Api(server)
    op = whatif_cmds.operation_doc(drain or [], cordon or [], lose_node or [], lose_label, add_node)
    if op is not None:
        if files:
            fail("plan either manifests (-f) or an operation, not both")
        whatif_cmds.plan_operation(api, op, output)
        return
    if not files:
        fail("nothing to plan: give manifests (-f FILE) or an operation (--drain, --cordon, --lose-node, "
             "--lose-label, --add-node)")
    results = []
    read = _read_files(files)
    for _source, doc in read.docs:
        r = api.request("POST", "/v1/plan", json=whatif_cmds.with_declared_volumes(doc, read.volumes))
        results.append(r)
        if output != "text":
            continue
        for rep in r["replicas"]:
            target = rep["node"] or "nowhere (would stay Pending)"
            out.print(f"workload/{rep['instance']} -> {target}", highlight=False)
            out.print(f"  {rep['explanation'].split('. Per node: ', 1)[0]}", markup=False, highlight=False)
            lines = score_lines(rep["decision"]) or reason_lines(rep["decision"], "    ")
            out.print("\n".join(lines), markup=False, highlight=False)
    if output != "text":
        emit(results, output)


@app.command()
def explain(
    name: str = typer.Argument(..., help="Workload name."),
    node: str = typer.Option("", "--node", help="Also show every filter's verdict and the scores for this node."),
    what_if: bool = typer.Option(False, "--what-if", help="For a Pending workload: the smallest changes that "
                                 "would make it fit (a smaller request, a toleration, a label, a node to uncordon, "
                                 "instances to move), each checked by the engine."),
    at: int = typer.Option(0, "--at", min=0, help="Replay the decision taken on the store at this revision "
                           "(shown as 'decided at revision N'): the snapshot is rebuilt from the store as it was then, "
                           "with the reservations then in flight, and the engine decides again; says whether the "
                           "answer agrees with the recorded one."),
    output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    """Explain why a workload went where it went, or why it went nowhere.

    `explain W --at REV` replays a past decision; `--what-if` lists what would make a Pending one fit."""
    if what_if:
        whatif_cmds.what_if(Api(server), name, output)
        return
    if at:
        replay_cmds.show_replay(Api(server), name, at, output)
        return
    r = Api(server).request("GET", f"/v1/workloads/{name}/explain", params={"node": node} if node else None)
    if output != "text":
        emit(r, output)
        return
    for rep in r["replicas"]:
        where = rep["node"] or "no node"
        out.print(f"workload/{rep['instance']}: {rep['phase']} on {where}", highlight=False)
        decision = rep.get("decision") or {}
        text = rep["explanation"] or "not evaluated yet"
        if (decision.get("seen") or {}).get("rev"):
            text += f"\n  decided at revision {decision['seen']['rev']} (replay: explain {name} --at " \
                    f"{decision['seen']['rev']})"
        if decision.get("reasons"):
            text = text.split(". Per node: ", 1)[0] + "\n  every reason per node:\n" + \
                "\n".join(reason_lines(decision, "    "))
        out.print(f"  {text}", markup=False, highlight=False)
        lines = score_lines(rep.get("decision") or {})
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
        names = [doc["metadata"]["name"] for _s, doc in _read_manifest_files(files)]
    elif kind and name:
        if resource_kind(kind) == "nodes":
            _delete_node(name, force, server)
            return
        if resource_kind(kind) == "secrets":
            secret_cmds.delete_secret(Api(server), name)
            return
        if resource_kind(kind) == "volumes":
            volume_cmds.delete_volume(Api(server), name)
            return
        if resource_kind(kind) == "policies":
            automation_cmds.delete_policy(Api(server), name)
            return
        if resource_kind(kind) == "buckets":
            r = Api(server).request("DELETE", f"/v1/buckets/{name}", params={"purge": "false"})
            out.print(f"bucket/{name} {'already gone' if r['alreadyGone'] else 'deleted'}", highlight=False)
            return
        names = [name]
    else:
        fail("give `workload NAME`, -f FILE or `workloads -l SELECTOR`")
    _delete_workloads(Api(server), names, wait, timeout)


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


@app.command()
def health(output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """Show the control plane's health and operating mode, and each dependency (state store,
    event bus, secret store, meter, node runtimes): ok, or FAILING with the reason."""
    h = Api(server).request("GET", "/v1/health")
    t = Table(box=None, show_header=False, pad_edge=False)
    for k, v in h.items():
        if k == "liveness":
            t.add_row(k, _liveness_line(v))
            continue
        if k == "dependencies":  # one row each: ok or what is wrong
            t.add_row(k, "")
            for d in v:
                state = "ok" if d["ok"] else "FAILING"
                t.add_row(f"  {d['name']}", state + (f": {d['reason']}" if d.get("reason") else ""))
            continue
        t.add_row(k, ", ".join(f"{kk} {scalar_text(vv)}" for kk, vv in v.items()) if isinstance(v, dict)
                  else scalar_text(v))
    emit(h, output, t)


def _liveness_line(g: dict[str, Any]) -> str:
    if not g.get("suspended"):
        return f"judging {g.get('judgedNodes', 0)} nodes ({g.get('silentNodes', 0)} silent)"
    return (f"SUSPENDED for {age_text(g['since'])} ({g['reason']}): {g['silentNodes']} of {g['judgedNodes']} nodes "
            f"silent, not marked NotReady; ends in {max(0, int(g['endsAt'] - time.time()))}s at the latest "
            "(persysctl admin liveness resume ends it now)")


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
def top(
    kind: str = typer.Argument("workloads", help="workloads or nodes"),
    since: str = typer.Option("", "--since", help="Average and maximum over this window from Persys Meter "
                              "(e.g. 10m, 1h, 7d) instead of the last report."),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    """Resource usage as last reported by the agents (CPU, memory, disk and network I/O), or with
    --since averaged over a window from Persys Meter."""
    k = resource_kind(kind)
    if since:
        meter_cmds.top_since(k, since, output, server)
        return
    items = Api(server).request("GET", f"/v1/{k}")
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col, justify in usage_rows.top_columns(k):
        t.add_column(col, justify=justify)
    rows = usage_rows.top_rows(k, items)
    for r in rows:  # Text: names and states are shown as they are, never read as markup
        t.add_row(*map(Text, usage_rows.top_cells(k, r)))
    emit(rows, output, t)


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
