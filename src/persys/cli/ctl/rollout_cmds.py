"""`persysctl rollout history|undo`: a workload's kept revisions and going back to one (kubectl's
rollout history and undo; docs/architecture.md, "Revision history")."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from persys.cli.ctl.api import Api, OutputOpt, ServerOpt, age_text, check_output, emit, out
from persys.cli.output.safe_text import cell

rollout_app = typer.Typer(
    help=("A workload's revision history, and rolling back to a kept revision.\n\n"
          "The scheduler keeps the last 10 specs applied to each workload (one per generation that "
          "changed the spec); a rollback applies an older one again, as a new generation.\n\n"
          "Examples:\n\n"
          "  persysctl rollout history hello-process\n\n"
          "  persysctl rollout undo hello-process   (back to the revision before)\n\n"
          "  persysctl rollout undo hello-process --to-generation 1"),
    no_args_is_help=True)


def history_table(items: list[dict[str, Any]]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("GENERATION", "REVISION", "CREATED", "CHANGE"):
        t.add_column(col, overflow="fold")
    for r in items:
        generation = f"{r['generation']}{' (current)' if r.get('current') else ''}"
        t.add_row(*map(cell, (generation, r["revision"], age_text(r["createdAt"]), r["change"])))
    return t


@rollout_app.command("history")
def history(
    name: str = typer.Argument(..., help="Workload name."),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    """List a workload's kept revisions, oldest first, with what each changed.

    Columns: the generation that applied the spec, its revision (content hash), its age and what it changed from the
    revision before it. -o json or yaml also prints each revision's whole spec.
    """
    check_output(output)
    items = Api(server).request("GET", f"/v1/workloads/{name}/revisions")["items"]
    if not items and output == "table":
        out.print(f"No revisions kept for workload/{name}.", highlight=False)
        return
    emit(items, output, history_table(items))


@rollout_app.command("undo")
def undo(
    name: str = typer.Argument(..., help="Workload name."),
    to_generation: int = typer.Option(0, "--to-generation", min=0, help=(
        "A generation `persysctl rollout history NAME` lists (default: the one before the newest).")),
    server: str | None = ServerOpt,
) -> None:
    """Roll a workload back to a kept revision (default: the one before the newest).

    The revision's spec is applied again, as a new generation with its own revision record; agents replace what
    runs, as after any apply. Labels stay as they are.
    """
    body = {"generation": to_generation} if to_generation else None
    r = Api(server).request("POST", f"/v1/workloads/{name}/rollback", json=body)
    if not r["changed"]:
        out.print(f"workload/{name} already runs the spec of generation {r['toGeneration']} "
                  f"(revision {r['revision']}): nothing changed", highlight=False)
        return
    out.print(f"workload/{name} rolled back to the spec of generation {r['toGeneration']}: now generation "
              f"{r['generation']} (revision {r['revision']}, was generation {r['fromGeneration']})", highlight=False)
