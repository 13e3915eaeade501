"""`persysctl config`: the client configuration's named contexts (which cluster, as whom)."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml
from rich.table import Table

from persys.cli.config import ConfigError, ConfigFile, config_path
from persys.cli.ctl.api import fail, out
from persys.cli.output.safe_text import cell
from persys.model.names import NAME_RE

config_app = typer.Typer(
    help=("The client configuration ($PERSYS_CONFIG or ~/.persys/config.yaml) and its named contexts.\n\n"
          "  persysctl config set-context prod --server https://persys.example:8443 --ca ca.crt --cert me.crt "
          "--key me.key\n\n"
          "  persysctl config use-context prod\n\n"
          "  persysctl --context dev get workloads   (one command against another context)"),
    no_args_is_help=True,
)


def _file() -> ConfigFile:
    path = config_path()
    if not path.exists():
        fail(f"no client configuration at {path} (start a cluster with `persys dev`, or "
             "`persysctl config set-context NAME --server URL --ca FILE ...`)")
    try:
        return ConfigFile.read(path)
    except ConfigError as err:
        fail(str(err))


def _check_name(name: str) -> None:
    if not NAME_RE.fullmatch(name):
        fail(f"context name {name!r}: lowercase letters, digits and '-' (at most 63)")


@config_app.command("get-contexts")
def get_contexts() -> None:
    """List the contexts; the current one is marked with *."""
    f = _file()
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("CURRENT", "NAME", "SERVER", "AUTH"):
        t.add_column(col)
    for name, c in sorted(f.contexts.items()):
        auth = "token" if c.get("token") else ("certificate" if c.get("cert") else "-")
        t.add_row("*" if name == f.current else "", cell(name), cell(c.get("server", "-")), auth)
    out.print(t)


@config_app.command("current-context")
def current_context() -> None:
    """Print the current context's name."""
    f = _file()
    if not f.current:
        fail("no current context (persysctl config use-context NAME)")
    out.print(f.current, markup=False, highlight=False)


@config_app.command("use-context")
def use_context(name: str = typer.Argument(..., help="A context from `persysctl config get-contexts`.")) -> None:
    """Make NAME the context every later command uses."""
    f = _file()
    if name not in f.contexts:
        fail(f"no context {name!r} (contexts: {', '.join(sorted(f.contexts))})")
    f.current = name
    f.write()
    out.print(f"switched to context {name!r}", markup=False, highlight=False)


def _existing(p: Path | None, what: str) -> str | None:
    if p is None:
        return None
    if not p.is_file():
        fail(f"--{what} {p}: no such file")
    return str(p.resolve())


@config_app.command("set-context")
def set_context(
    name: str = typer.Argument(..., help="The context to create or change."),
    server: str | None = typer.Option(None, "--server", help="The gateway's URL (https://HOST:PORT)."),
    ca: Path | None = typer.Option(None, "--ca", help="The cluster CA certificate that signed the gateway's."),
    cert: Path | None = typer.Option(None, "--cert", help="Your client certificate (with --key)."),
    key: Path | None = typer.Option(None, "--key", help="Your client certificate's private key."),
    token_file: Path | None = typer.Option(None, "--token-file", help="A file holding an API token (persysctl "
                                           "auth token create), used instead of a certificate."),
) -> None:
    """Create a context, or change the fields given of an existing one. A one-cluster file first
    becomes the context `default`. Idempotent; the current context does not change (use-context)."""
    _check_name(name)
    path = config_path()
    f = _file() if path.exists() else ConfigFile(path, {}, "", True)
    ctx = dict(f.contexts.get(name, {}))
    if server is not None:
        if not server.startswith("https://"):
            fail(f"--server {server!r}: the gateway speaks HTTPS only (https://HOST:PORT)")
        ctx["server"] = server
    for field, value in (("ca", _existing(ca, "ca")), ("cert", _existing(cert, "cert")),
                         ("key", _existing(key, "key"))):
        if value is not None:
            ctx[field] = value
    if token_file is not None:
        if not token_file.is_file():
            fail(f"--token-file {token_file}: no such file")
        ctx["token"] = token_file.read_text().strip()
        ctx.pop("cert", None)
        ctx.pop("key", None)
    if ("cert" in ctx) != ("key" in ctx):
        fail("a client certificate needs both --cert and --key")
    missing = [m for m in ("server", "ca") if m not in ctx]
    if missing:
        fail(f"context {name!r} needs {' and '.join('--' + m for m in missing)}")
    created = name not in f.contexts
    f.contexts[name] = ctx
    f.current = f.current or name
    f.write()
    out.print(f"context {name!r} {'created' if created else 'changed'}", markup=False, highlight=False)


@config_app.command("delete-context")
def delete_context(name: str = typer.Argument(..., help="The context to remove.")) -> None:
    """Remove a context (not the current one: use-context another first)."""
    f = _file()
    if name not in f.contexts:
        out.print(f"context {name!r} already gone", markup=False, highlight=False)
        return
    if name == f.current:
        fail(f"{name!r} is the current context: `persysctl config use-context` another first")
    del f.contexts[name]
    f.write()
    out.print(f"context {name!r} deleted", markup=False, highlight=False)


@config_app.command("view")
def view() -> None:
    """Print the configuration, API tokens shown as REDACTED."""
    f = _file()
    shown = {n: {k: ("REDACTED" if k == "token" else v) for k, v in c.items()} for n, c in f.contexts.items()}
    out.print(yaml.safe_dump({"currentContext": f.current, "contexts": shown}, sort_keys=False).rstrip(),
              markup=False, highlight=False)
