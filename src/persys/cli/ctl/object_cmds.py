"""persysctl's `object ls|put|get`: objects of a bucket straight on RGW's S3 API (boto3), with a
bucket key's credentials. The control plane is not involved: the key decides what is allowed."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from persys.cli.ctl.api import OutputOpt, emit, fail, out
from persys.cli.output.safe_text import cell

object_app = typer.Typer(
    help="Objects of a bucket, straight on the cluster's RGW (S3) with a bucket key.\n\n"
    "Credentials: --access-key/--secret-key, or the environment a key's secret gives a workload "
    "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); the endpoint: --endpoint or S3_ENDPOINT. Prefer the "
    "environment for the secret key (the command line is visible to other users of the machine).",
    no_args_is_help=True)

EndpointOpt = typer.Option(None, "--endpoint", help="RGW's URL (default: $S3_ENDPOINT).")
AccessOpt = typer.Option(None, "--access-key", help="Access key id (default: $AWS_ACCESS_KEY_ID).")
SecretOpt = typer.Option(None, "--secret-key", help="Secret key (default: $AWS_SECRET_ACCESS_KEY; prefer it).")
TIMEOUT_S = 60


def _client(endpoint: str | None, access: str | None, secret: str | None) -> Any:
    import boto3
    from botocore.config import Config

    url = endpoint or os.environ.get("S3_ENDPOINT", "")
    access = access or os.environ.get("AWS_ACCESS_KEY_ID", "")
    secret = secret or os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    if not url.startswith(("http://", "https://")):
        fail("--endpoint: RGW's http(s) URL is needed (or S3_ENDPOINT)")
    if not access or not secret:
        fail("--access-key/--secret-key: a bucket key is needed (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
             "`persysctl bucket key create` makes one)")
    cfg = Config(s3={"addressing_style": "path"}, connect_timeout=TIMEOUT_S, read_timeout=TIMEOUT_S,
                 retries={"max_attempts": 2}, signature_version="s3v4")
    return boto3.session.Session().client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=access,
                                          aws_secret_access_key=secret, config=cfg)


def _s3(call: Any, **kwargs: Any) -> Any:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call(**kwargs)
    except ClientError as err:
        e = err.response.get("Error", {})
        fail(f"RGW refused: {e.get('Code', '?')}{': ' + str(e.get('Message')) if e.get('Message') else ''}")
    except BotoCoreError as err:
        fail(f"RGW unreachable: {type(err).__name__}")


@object_app.command("ls")
def ls(bucket: str = typer.Argument(..., help="The bucket."),
       prefix: str = typer.Argument("", help="Only objects whose key starts with this."),
       output: str = OutputOpt, endpoint: str | None = EndpointOpt, access_key: str | None = AccessOpt,
       secret_key: str | None = SecretOpt) -> None:
    """List a bucket's objects (key, size, last change)."""
    s3 = _client(endpoint, access_key, secret_key)
    rows: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
        page = _s3(s3.list_objects_v2, **kw)
        rows += [{"key": o["Key"], "size": o["Size"], "modified": o["LastModified"].isoformat()}
                 for o in page.get("Contents", [])]
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            break
    if not rows and output == "table":
        out.print(f"bucket {bucket} holds no objects" + (f" under {prefix!r}" if prefix else "") + ".",
                  markup=False, highlight=False)
        return
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("KEY", "SIZE", "MODIFIED"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(cell(r["key"]), str(r["size"]), r["modified"])
    emit(rows, output, t)


@object_app.command("put")
def put(bucket: str = typer.Argument(..., help="The bucket."),
        key: str = typer.Argument(..., help="The object's key."),
        file: Path = typer.Argument(..., help="The file to upload (- for stdin)."),
        endpoint: str | None = EndpointOpt, access_key: str | None = AccessOpt,
        secret_key: str | None = SecretOpt) -> None:
    """Upload a file as an object (needs an admin key: a read-only key is refused)."""
    s3 = _client(endpoint, access_key, secret_key)
    if str(file) == "-":
        _s3(s3.upload_fileobj, Fileobj=sys.stdin.buffer, Bucket=bucket, Key=key)
    else:
        if not file.is_file():
            fail(f"{file}: no such file")
        _s3(s3.upload_file, Filename=str(file), Bucket=bucket, Key=key)
    out.print(f"{bucket}/{key} uploaded", markup=False, highlight=False)


@object_app.command("get")
def get(bucket: str = typer.Argument(..., help="The bucket."),
        key: str = typer.Argument(..., help="The object's key."),
        file: str = typer.Argument("-", help="Where to write it (default -: stdout)."),
        endpoint: str | None = EndpointOpt, access_key: str | None = AccessOpt,
        secret_key: str | None = SecretOpt) -> None:
    """Download an object to a file or stdout."""
    s3 = _client(endpoint, access_key, secret_key)
    if file == "-":
        _s3(s3.download_fileobj, Bucket=bucket, Key=key, Fileobj=sys.stdout.buffer)
        sys.stdout.flush()
    else:
        _s3(s3.download_file, Bucket=bucket, Key=key, Filename=file)
        out.print(f"{bucket}/{key} written to {file}", markup=False, highlight=False)
