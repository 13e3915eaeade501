"""What every persysctl command shares: the gateway transport, errors and output formats."""

from __future__ import annotations

import json
import ssl
import sys
from collections.abc import Callable
from typing import IO, Any, NoReturn

import httpx
import typer
import yaml
from rich.console import Console
from rich.table import Table

from persys.cli.config import ConfigError, load_client_config
from persys.cli.ctl import tracing as ctl_tracing
from persys.cli.output import refusal
from persys.cli.output.listing_rows import KINDS
from persys.cli.output.listing_rows import age_text as age_text  # where the commands import them from
from persys.cli.output.listing_rows import name_line as name_line
from persys.cli.output.printed_doc import printed
from persys.cli.output.usage_rows import size_text as size_text
from persys.security import peer_names

OUTPUT_FORMATS = "table, wide, name, json, yaml or jsonpath=TEMPLATE"
OutputOpt = typer.Option("table", "--output", "-o", help=(
    f"Output format: {OUTPUT_FORMATS}. wide: more columns; name: kind/name per line; jsonpath: "
    "kubectl's template subset over the JSON, e.g. -o jsonpath='{range .items[*]}{.name}{\"\\n\"}{end}' "
    "(a list is {\"items\": [...]})."))
ServerOpt = typer.Option(None, "--server", help="Gateway URL, overriding the configuration file.")

# Piped output is not wrapped at 80 columns: scripts and logs want whole lines.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 250)
err_console = Console(stderr=True, soft_wrap=True)



class CtlError(Exception):
    """One clear line for the user; exit code 1."""


def fail(message: str) -> NoReturn:
    raise CtlError(message)


# --------------------------------------------------------------------------- transport


class Api:
    token: str | None = None  # --token (or $PERSYS_TOKEN), for every request of this run
    context: str | None = None  # --context (or $PERSYS_CONTEXT): which cluster of the configuration
    server: str | None = None  # the global --server: a command's own --server wins over it
    trace_id: str = ""  # the trace id the gateway returned last (x-persys-trace-id)

    def __init__(self, server: str | None) -> None:
        try:
            cfg = load_client_config(server=server or Api.server, token=Api.token, context=Api.context)
        except ConfigError as e:
            fail(str(e))
        self.base = cfg.server.rstrip("/")
        ctx = ssl.create_default_context(cafile=str(cfg.ca))
        if cfg.cert is not None and cfg.key is not None:
            ctx.load_cert_chain(str(cfg.cert), str(cfg.key))  # our identity for mutual TLS
        headers = {"authorization": f"Bearer {cfg.token}"} if cfg.token else {}  # a token wins over the cert
        self.ssl_context, self.headers = ctx, headers  # also for terminals' WebSockets (cli.ctl.terminal_client)
        self.http = httpx.Client(base_url=self.base, verify=ctx, timeout=30.0, headers=headers)

    def request(self, method: str, path: str, missing_ok: bool = False, **kw: Any) -> Any:
        """The JSON answer; with `missing_ok`, None for a 404 instead of an error."""
        parent = ctl_tracing.traceparent()
        if parent:  # this command's span: the gateway's request span becomes its child
            kw["headers"] = {**kw.get("headers", {}), "traceparent": parent}
        try:
            # The gateway's certificate must carry the gateway role's name, whatever host the
            # configuration names: a node's or a user's certificate cannot pose as the API.
            resp = self.http.request(method, path, extensions={"sni_hostname": peer_names.GATEWAY}, **kw)
        except httpx.ConnectError:
            fail(f"cannot reach the Persys gateway at {self.base} (is the cluster running?)")
        except httpx.TimeoutException:
            fail(f"the Persys gateway at {self.base} did not answer in time")
        except httpx.HTTPError as e:
            fail(f"request to {self.base} failed: {e}")
        # The gateway's trace of this request (it answers with one only when it traces).
        self.trace_id = resp.headers.get("x-persys-trace-id", "") or self.trace_id
        if resp.status_code == 404 and missing_ok:
            return None
        if resp.status_code >= 400:
            _refused(resp)
        return resp.json()

    def download(self, path: str, into: IO[bytes], limit: int, **kw: Any) -> int:
        """Stream a binary answer into a file, at most `limit` bytes; the byte count."""
        size = 0
        try:
            with self.http.stream("GET", path, extensions={"sni_hostname": peer_names.GATEWAY}, **kw) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _refused(resp)
                for chunk in resp.iter_bytes():
                    size += len(chunk)
                    if size > limit:
                        fail(f"the answer exceeds {limit} bytes")
                    into.write(chunk)
        except httpx.ConnectError:
            fail(f"cannot reach the Persys gateway at {self.base} (is the cluster running?)")
        except httpx.TimeoutException:
            fail(f"the Persys gateway at {self.base} did not answer in time")
        except httpx.HTTPError as e:
            fail(f"request to {self.base} failed: {e}")
        return size


def refusal_text(resp: httpx.Response) -> str:
    """The one line an error answer (read already) says (`cli.output.refusal`)."""
    return refusal.refusal_text(resp.content, resp.reason_phrase)


def _refused(resp: httpx.Response) -> NoReturn:
    fail(refusal_text(resp))


# --------------------------------------------------------------------------- output helpers


def check_output(output: str) -> None:
    """Refuse an unknown -o before anything is asked of the gateway."""
    if output not in ("table", "text", "wide", "name", "json", "yaml") and not output.startswith("jsonpath="):
        fail(f"unknown output format {output!r} (use {OUTPUT_FORMATS})")


def emit(data: Any, output: str, table: Table | None = None, *, wide: Table | None = None, kind: str = "") -> None:
    """Print what a command got in the -o format asked for: `table` (and `wide`, when the command
    has more columns) as the command renders it; `name` as kind/name lines (commands that list
    objects pass their kind); json, yaml and jsonpath over the data as `printed_doc` presents it."""
    check_output(output)
    if output in ("json", "yaml") or output.startswith("jsonpath="):
        data = printed(data)  # RFC 3339 times, camelCase keys
    if output == "json":
        out.print_json(json.dumps(data))
    elif output == "yaml":
        out.print(yaml.safe_dump(data, sort_keys=False).rstrip(), markup=False, highlight=False)
    elif output.startswith("jsonpath="):
        write_jsonpath(output, {"items": data} if isinstance(data, list) else data)
    elif output == "name":
        if not kind:
            fail("-o name lists objects; this command shows none (use -o json or yaml)")
        for item in data if isinstance(data, list) else [data]:
            sys.stdout.write(name_line(kind, item) + "\n")
    elif output == "wide" and (wide or table) is not None:
        out.print(wide or table)
    elif output in ("table", "text", "wide") and table is not None:
        out.print(table)


def get_listing(api: Api, resource: str, name: str | None, output: str,
                table: Callable[[list[dict[str, Any]]], Table]) -> None:
    """`get RESOURCE [NAME]` for a resource listed whole (secrets, volumes, buckets): the one
    object or all of them, printed as -o asks."""
    items = [api.request("GET", f"/v1/{resource}/{name}")] if name else api.request("GET", f"/v1/{resource}")
    if not items and output == "table":
        out.print(f"No {resource} found.")
        return
    emit(items[0] if name else items, output, table(items), kind=resource[:-1])


def write_jsonpath(output: str, data: Any) -> None:
    from persys.cli.output.jsonpath import TemplateError, render

    try:
        sys.stdout.write(render(output.removeprefix("jsonpath="), data))
    except TemplateError as err:
        fail(f"-o jsonpath: {err}")
    sys.stdout.flush()


def object_ref(kind: str | None, name: str | None) -> tuple[str | None, str | None]:
    """(kind, name) from `KIND NAME` or kubectl's `KIND/NAME` (what `-o name` prints), also given
    as the name (`get workloads workload/web`) when both say the same kind."""
    if kind and "/" in kind:
        k, _, n = kind.partition("/")
        if name is not None:
            fail(f"give {kind!r} or {k!r} and a name, not both")
        if not n:
            fail(f"{kind!r}: no name after the '/'")
        return k, n
    if kind and name and "/" in name:
        k, _, n = name.partition("/")
        if resource_kind(k) != resource_kind(kind):
            fail(f"{name!r} is a {k}, not one of {kind}")
        return kind, n
    return kind, name


def resource_kind(kind: str) -> str:
    """The canonical resource kind (workloads, nodes, secrets, volumes or buckets) a user typed."""
    k = KINDS.get(kind.lower())
    if k is None:
        fail(f"unknown resource kind {kind!r} (use workloads, nodes, secrets, volumes, buckets or policies)")
    return k


def scalar_text(v: Any) -> str:
    """A value as JSON writes it (true, false, null), not as Python does (True, False, None)."""
    return v if isinstance(v, str) else json.dumps(v)
