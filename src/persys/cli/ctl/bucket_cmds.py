"""persysctl's bucket commands: `bucket create|list|delete`, `bucket key create|list|delete`, and
applying `kind: Bucket`. Buckets live on the cluster's Ceph RGW; a key's values go to a secret
that workloads reference, and never to this terminal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from persys.cli.ctl.api import Api, OutputOpt, ServerOpt, age_text, emit, get_listing, out, size_text
from persys.cli.output.safe_text import cell, printable

if TYPE_CHECKING:
    from persys.model.bucket import BucketManifest

bucket_app = typer.Typer(
    help="S3 buckets on the cluster's Ceph RGW (the scheduler's --storage file has an rgw: section).\n\n"
    "A bucket is used through keys: `bucket key create NAME --role admin` stores a new key as the secret "
    "bucket-NAME-KEYID (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, S3_ENDPOINT, S3_BUCKET), which a "
    "workload references in spec.secrets (env or files). `persysctl object ls|put|get` reach the objects "
    "with such a key.", no_args_is_help=True)
key_app = typer.Typer(help="A bucket's keys: role read-only (list, get) or admin (also put, delete).",
                      no_args_is_help=True)
bucket_app.add_typer(key_app, name="key")


def _quota(q: dict[str, Any]) -> str:
    parts = [f"{q['maxSizeMb']} MiB" if q.get("maxSizeMb") else "", f"{q['maxObjects']} objects"
             if q.get("maxObjects") else ""]
    return ", ".join(p for p in parts if p) or "-"


def bucket_table(items: list[dict[str, Any]]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("NAME", "PHASE", "QUOTA", "KEYS", "USED BY", "AGE"):
        t.add_column(col, overflow="fold")
    for b in items:
        keys = ",".join(f"{k['id']}({k['role']})" for k in b.get("keys", []))
        t.add_row(*map(cell, (b["name"], b["phase"], _quota(b.get("quota", {})), keys or "-",
                              ",".join(b.get("usedBy", [])) or "-", age_text(b["createdAt"]))))
    return t


def apply_buckets(api: Api, buckets: list[BucketManifest], dry_run: bool) -> list[dict[str, Any]]:
    results = []
    for m in buckets:
        doc = m.model_dump(mode="json", by_alias=True, exclude_unset=True)
        r = api.request("POST", "/v1/buckets", params={"dryRun": str(dry_run).lower()}, json=doc)
        out.print(f"bucket/{m.metadata.name} {'created' if r['created'] else 'configured'}"
                  f"{' (dry run)' if dry_run else ''}", highlight=False)
        results.append(r)
    return results


def get_buckets(api: Api, name: str | None, output: str) -> None:
    """`persysctl get buckets [NAME]`: as `bucket list`, or one bucket."""
    get_listing(api, "buckets", name, output, bucket_table)


def _usage(u: dict[str, Any] | None) -> str:
    if not u:
        return "-"
    if "unavailable" in u:
        return f"unknown ({u['unavailable']})"
    return f"{u.get('objects', 0)} objects, {size_text(int(u.get('sizeKb', 0)) * 1024)}"


def describe_bucket(api: Api, name: str, output: str) -> None:
    """`persysctl describe bucket NAME`: the binding, its keys (never a key's secret), its users."""
    b = api.request("GET", f"/v1/buckets/{name}")
    if output != "text":
        emit(b, output)
        return
    lines = [f"Name:      {b['name']}", f"Phase:     {b['phase']}" + (f" ({b['reason']})" if b.get("reason") else ""),
             f"Owner:     {b['owner']} (the object store's user)", f"Quota:     {_quota(b.get('quota', {}))}",
             f"Labels:    {', '.join(f'{k}={v}' for k, v in sorted(b.get('labels', {}).items())) or '-'}",
             f"Usage:     {_usage(b.get('usage'))}", f"Created:   {age_text(b['createdAt'])} ago", "Keys:"]
    keys = b.get("keys", [])
    none = f"  (none: persysctl bucket key create {b['name']})"
    lines += [f"  {k['id']}  {k['role']}  {k.get('phase', '')}  access key id {k.get('accessKeyId') or '-'}  "
              f"secret {k.get('secret') or '-'}" for k in keys] or [none]
    lines.append(f"Used by:   {', '.join(b.get('usedBy', [])) or '-'}")
    out.print(printable("\n".join(lines), keep_newlines=True), markup=False, highlight=False)


@bucket_app.command("create")
def create(name: str = typer.Argument(..., help="The bucket's name: S3 rules (3-49 lowercase letters, digits, "
                                      "'-'; its keys' secrets are named bucket-NAME-KEYID)."),
           max_size_mb: int | None = typer.Option(None, "--max-size-mb", help="Quota: MiB the objects may take."),
           max_objects: int | None = typer.Option(None, "--max-objects", help="Quota: how many objects it holds."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Check only; create nothing."),
           server: str | None = ServerOpt) -> None:
    """Create a bucket (or change its quota). Idempotent: run it again to resume one an outage interrupted."""
    quota = {k: v for k, v in (("maxSizeMb", max_size_mb), ("maxObjects", max_objects)) if v is not None}
    doc = {"apiVersion": "persys.dev/v1", "kind": "Bucket", "metadata": {"name": name}, "spec": {"quota": quota}}
    r = Api(server).request("POST", "/v1/buckets", params={"dryRun": str(dry_run).lower()}, json=doc)
    out.print(f"bucket/{name} {'created' if r['created'] else 'configured'}{' (dry run)' if dry_run else ''}",
              highlight=False)


@bucket_app.command("list")
def list_buckets(output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """Every bucket: phase, quota, keys (id and role), the workloads that reference its keys."""
    get_buckets(Api(server), None, output)


@bucket_app.command("delete")
def delete(name: str = typer.Argument(..., help="The bucket."),
           purge: bool = typer.Option(False, "--purge", help="Delete the objects it holds too (else refused while "
                                      "it holds any)."),
           server: str | None = ServerOpt) -> None:
    """Delete a bucket with its keys and their secrets. Refused while a workload references one of its
    keys' secrets: delete those workloads first."""
    r = Api(server).request("DELETE", f"/v1/buckets/{name}", params={"purge": str(purge).lower()})
    out.print(f"bucket/{name} {'already gone' if r['alreadyGone'] else 'deleted'}", highlight=False)


@key_app.command("create")
def key_create(name: str = typer.Argument(..., help="The bucket."),
               role: str = typer.Option(..., "--role", help="read-only (list and get objects) or admin (also put "
                                        "and delete objects)."),
               output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
               server: str | None = ServerOpt) -> None:
    """Make a key. Its values are stored as a secret (named in the answer) with the keys AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, S3_ENDPOINT and S3_BUCKET; a workload gets them through spec.secrets, e.g.

      secrets: {env: [{name: AWS_SECRET_ACCESS_KEY,
                       secretRef: {name: bucket-photos-a1b2c3, key: AWS_SECRET_ACCESS_KEY}}]}
    """
    k = Api(server).request("POST", f"/v1/buckets/{name}/keys", json={"role": role})
    if output != "text":
        emit(k, output)
        return
    out.print(f"bucket/{name} key {k['id']} ({k['role']}) created: access key id {k['accessKeyId']}, "
              f"values in secret {k['secret']}", markup=False, highlight=False)


@key_app.command("list")
def key_list(name: str = typer.Argument(..., help="The bucket."), output: str = OutputOpt,
             server: str | None = ServerOpt) -> None:
    """The bucket's keys: id, role, access key id and secret name (never the secret key)."""
    items = Api(server).request("GET", f"/v1/buckets/{name}/keys")
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ID", "ROLE", "ACCESS KEY ID", "SECRET", "PHASE", "AGE"):
        t.add_column(col)
    for k in items:
        t.add_row(*map(cell, (k["id"], k["role"], k.get("accessKeyId") or "-", k.get("secret") or "-", k["phase"],
                              age_text(k["createdAt"]))))
    if not items and output == "table":
        out.print(f"bucket/{name} has no keys.")
        return
    emit(items, output, t)


@key_app.command("delete")
def key_delete(name: str = typer.Argument(..., help="The bucket."),
               key_id: str = typer.Argument(..., help="The key's id (bucket key list)."),
               server: str | None = ServerOpt) -> None:
    """Delete a key in RGW and its secret. Refused while a workload references the secret."""
    r = Api(server).request("DELETE", f"/v1/buckets/{name}/keys/{key_id}")
    out.print(f"bucket/{name} key {key_id} {'already gone' if r['alreadyGone'] else 'deleted'}", highlight=False)
