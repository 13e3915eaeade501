"""`persysctl move WORKLOAD/INSTANCE [--to NODE]`: one instance to another node."""

from __future__ import annotations

import typer

from persys.cli.ctl.api import Api, OutputOpt, ServerOpt, emit, out
from persys.cli.output.safe_text import printable


def move(
    target: str = typer.Argument(..., metavar="WORKLOAD/INSTANCE",
                                 help="The workload and its instance: web/web.2, or web/2 (an index); web alone: "
                                 "its first instance."),
    to: str = typer.Option("", "--to", help="The node to move it to (checked first); left out: where the placement "
                           "engine places it, never the node it is on."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the move and say where it would go; move nothing."),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    """Move one instance of a workload to another node.

    The placement engine checks the destination first (capacity, runtimes, selectors, taints:
    every filter); a move never preempts anyone. The instance is stopped on its node before it
    starts on the other, so a workload with a single-writer volume never runs twice. Its status
    records when it moved (the rebalance policy holds back what moved recently). Refused, nothing
    written, when no other node takes it, when its data is node-local, or while it is being moved.
    Operators and admins; audited.

    Examples:

      persysctl move web/web.2 --to node-b

      persysctl move web/0 --dry-run      # where would it go?
    """
    workload, _, instance = target.partition("/")
    if not workload:
        raise typer.BadParameter("WORKLOAD/INSTANCE: the workload's name is required (e.g. web/web.1)")
    r = Api(server).request("POST", f"/v1/workloads/{workload}/instances/{instance or '0'}/move",
                            params={"to": to, "dryRun": str(dry_run).lower()})
    if output not in ("table", "wide"):
        emit(r, output)
        return
    verb = "would move" if r["dryRun"] else "moving"
    out.print(printable(f"{r['instance']}: {verb} {r['from']} -> {r['to']} ({r['verified'][:200]})"), highlight=False)
