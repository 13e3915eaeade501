"""`persysctl describe`, `plan` and `explain`: one object in detail, where a manifest would go, and
why a workload went where it went (or nowhere)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from persys.cli.ctl import (
    automation_cmds,
    bucket_cmds,
    replay_cmds,
    secret_cmds,
    volume_cmds,
    whatif_cmds,
)
from persys.cli.ctl.api import (
    Api,
    ServerOpt,
    age_text,
    emit,
    fail,
    object_ref,
    out,
    resource_kind,
)
from persys.cli.ctl.apply_cmd import read_files
from persys.cli.output.describe_text import node_text, reason_lines, score_lines, workload_text
from persys.cli.output.safe_text import printable


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
    read = read_files(files)
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
        _print_replica_decision(rep, name)
    if r.get("node"):
        _print_node_evaluation(r["node"])


def _print_replica_decision(rep: dict[str, Any], name: str) -> None:
    """One instance: where it is, why (every reason per node when recorded), the top candidates."""
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


def _print_node_evaluation(ev: dict[str, Any]) -> None:
    """`explain --node N`: every filter's verdict for that node, and its score when feasible."""
    verdict = "feasible" if ev["feasible"] else "rejected"
    out.print(f"node/{ev['node_id']}: {verdict}", highlight=False)
    for f in ev["filters"]:
        mark = "pass" if f["passed"] else "FAIL"
        detail = "" if f["passed"] else f"  {f['message']}"
        out.print(f"  {mark:<5}{f['filter']}{detail}", markup=False, highlight=False)
    if ev["feasible"]:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in ev["breakdown"].items())
        out.print(f"  score {ev['total']:.1f} [{parts}]", markup=False, highlight=False)
