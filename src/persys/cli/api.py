"""What every persysctl command shares: the gateway transport, errors and output formats."""

from __future__ import annotations

import json
import ssl
import sys
import time
from typing import Any, NoReturn

import httpx
import typer
import yaml
from rich.console import Console
from rich.table import Table

from persys.cli import ctl_tracing
from persys.cli.config import ConfigError, load_client_config
from persys.security import peer_names

OutputOpt = typer.Option("table", "--output", "-o", help="Output format: table, json or yaml.")
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
    trace_id: str = ""  # the trace id the gateway returned last (x-persys-trace-id)

    def __init__(self, server: str | None) -> None:
        try:
            cfg = load_client_config(server=server, token=Api.token)
        except ConfigError as e:
            fail(str(e))
        self.base = cfg.server.rstrip("/")
        ctx = ssl.create_default_context(cafile=str(cfg.ca))
        if cfg.cert is not None and cfg.key is not None:
            ctx.load_cert_chain(str(cfg.cert), str(cfg.key))  # our identity for mutual TLS
        headers = {"authorization": f"Bearer {cfg.token}"} if cfg.token else {}  # a token wins over the cert
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
            try:
                body = resp.json()
                msg = body.get("error") or _detail(body.get("detail")) or resp.text
            except ValueError:
                msg = resp.text or resp.reason_phrase
            fail(str(msg))
        return resp.json()


def _detail(detail: Any) -> str:
    """FastAPI's 422 `detail` (a list of {loc, msg}) as one line naming each field."""
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg', '')}"
                         for d in detail if isinstance(d, dict))
    return str(detail or "")


# --------------------------------------------------------------------------- output helpers


def emit(data: Any, output: str, table: Table | None = None) -> None:
    if output == "json":
        out.print_json(json.dumps(data))
    elif output == "yaml":
        out.print(yaml.safe_dump(data, sort_keys=False).rstrip(), markup=False, highlight=False)
    elif output == "table" and table is not None:
        out.print(table)
    elif output != "table":
        fail(f"unknown output format {output!r} (use table, json or yaml)")


KINDS = {
    "workload": "workloads", "workloads": "workloads", "wl": "workloads",
    "node": "nodes", "nodes": "nodes", "no": "nodes",
    "secret": "secrets", "secrets": "secrets",
    "volume": "volumes", "volumes": "volumes", "vol": "volumes",
}


def resource_kind(kind: str) -> str:
    """The canonical resource kind (workloads, nodes, secrets or volumes) a user typed."""
    k = KINDS.get(kind.lower())
    if k is None:
        fail(f"unknown resource kind {kind!r} (use workloads, nodes, secrets or volumes)")
    return k


def size_text(n: float) -> str:
    """A byte count as people read it (KiB, MiB, GiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def age_text(ts: float) -> str:
    """How long ago a timestamp was, in its largest unit (5m, 3h, 2d)."""
    if not ts:
        return "-"
    s = max(0, int(time.time() - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"
