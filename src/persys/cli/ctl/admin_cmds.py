"""persysctl admin: backup, restore, liveness resume, recover."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from persys.cli.ctl.api import Api, ServerOpt, err_console, fail, out

admin_app = typer.Typer(help="Back up, restore and recover the control plane's state.", no_args_is_help=True)


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
