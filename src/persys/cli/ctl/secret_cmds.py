"""persysctl's secret commands: `get|describe|delete secret`, applying `kind: Secret`
documents, and `secret migrate`. Nothing here prints a value: the API never returns one."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from persys.cli.ctl.api import Api, ServerOpt, age_text, emit, fail, get_listing, out
from persys.cli.ctl.views import workload_manifest
from persys.cli.output.safe_text import cell

if TYPE_CHECKING:
    from persys.model.secret import SecretManifest

secret_app = typer.Typer(
    help="Secrets beyond apply/get/describe/delete: `persysctl secret migrate` moves workloads' "
    "plaintext env values into secrets.", no_args_is_help=True)


def secret_table(items: list[dict[str, Any]]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("NAME", "KEYS", "VERSION", "UPDATED", "AGE"):
        t.add_column(col, overflow="fold")
    for s in items:
        keys = ",".join(s["keys"]) if "keys" in s else "(hidden)"
        t.add_row(*map(cell, (s["name"], keys, str(s["version"]), age_text(s["updatedAt"]) + " ago",
                              age_text(s["createdAt"]))))
    return t


def get_secrets(api: Api, name: str | None, output: str) -> None:
    get_listing(api, "secrets", name, output, secret_table)


def describe_secret(api: Api, name: str, output: str) -> None:
    s = api.request("GET", f"/v1/secrets/{name}")
    if output != "text":
        emit(s, output)
        return
    lines = [f"Name:     {s['name']}", f"Version:  {s['version']}",
             f"Created:  {age_text(s['createdAt'])} ago", f"Updated:  {age_text(s['updatedAt'])} ago",
             "Keys:     " + (", ".join(s["keys"]) or "-"), "Used by:  " + (", ".join(s.get("usedBy", [])) or "-")]
    for line in lines:
        out.print(cell(line), markup=False, highlight=False)


def delete_secret(api: Api, name: str) -> None:
    r = api.request("DELETE", f"/v1/secrets/{name}")
    out.print(f"secret/{name} {'deleted' if r['deleted'] else 'already gone'}", highlight=False)


def apply_secrets(api: Api, secrets: list[SecretManifest], dry_run: bool) -> list[dict[str, Any]]:
    results = []
    for s in secrets:
        name = s.metadata.name
        if dry_run:
            out.print(f"secret/{name} configured (dry run)", highlight=False)
            continue
        r = api.request("PUT", f"/v1/secrets/{name}", json=s.body())
        rolled = f", restarted {', '.join(r['rolled'])}" if r.get("rolled") else ""
        out.print(f"secret/{name} {'created' if r['version'] == 1 else 'configured'} (version {r['version']}"
                  f"{rolled})", highlight=False)
        results.append(r)
    return results


def _migrate_one(api: Api, view: dict[str, Any], dry_run: bool) -> bool:
    from persys.model.workload import Workload
    from persys.secrets.refs import migrate

    w = Workload.model_validate({k: view[k] for k in ("id", "name", "labels", "spec", "revision")}
                                | {"createdAt": 0, "updatedAt": 0})
    m = migrate(w)
    if m is None:
        out.print(f"workload/{w.id}: no plaintext env values", highlight=False)
        return False
    keys = ", ".join(sorted(m.data))
    if dry_run:
        out.print(f"workload/{w.id}: would move {keys} into secret/{m.secret} (dry run)", highlight=False)
        return True
    existing = api.request("GET", f"/v1/secrets/{m.secret}", missing_ok=True)
    data = {k: base64.b64encode(v).decode() for k, v in m.data.items()}
    if existing is not None and set(existing["keys"]) != set(m.data):  # not ours from an interrupted run
        fail(f"secret/{m.secret} exists with other keys ({', '.join(existing['keys'])}); move {keys} by hand")
    api.request("PUT", f"/v1/secrets/{m.secret}", json={"data": data})
    manifest = workload_manifest(view) | {"spec": m.spec.to_doc()}
    api.request("POST", "/v1/workloads", json=manifest)
    out.print(f"workload/{w.id}: moved {keys} into secret/{m.secret} and now references it", highlight=False)
    return True


@secret_app.command("migrate")
def migrate_command(
    workload: list[str] = typer.Option([], "--workload", "-w", help="Only these workloads (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would move; change nothing."),
    server: str | None = ServerOpt,
) -> None:
    """Move workloads' plaintext env values into secrets: each workload W gets secret W-env (one
    key per variable) and references it (spec.secrets.env) instead. Idempotent: a workload
    without plaintext env is left alone. The workload restarts with its new revision."""
    api = Api(server)
    names = workload or [w["name"] for w in api.request("GET", "/v1/workloads")]
    moved = sum(_migrate_one(api, api.request("GET", f"/v1/workloads/{n}"), dry_run) for n in names)
    out.print(f"{moved} workload(s) {'to migrate' if dry_run else 'migrated'}", highlight=False)

