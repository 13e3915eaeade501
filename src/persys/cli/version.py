"""`--version` for both binaries: the Persys version and what it runs on (for bug reports)."""

from __future__ import annotations

import platform
from typing import Any

import persys


def version_text(program: str) -> str:
    from importlib.metadata import version

    return (f"{program} {persys.__version__} (python {platform.python_version()}, grpcio {version('grpcio')}, "
            f"{platform.system().lower()}/{platform.machine()})")


def version_option(program: str) -> Any:
    """The eager `--version` flag: prints and exits before anything else runs (typer loads here:
    `cli.quick.entry` prints the version without it)."""
    import typer

    def show(value: bool) -> None:
        if value:
            typer.echo(version_text(program))
            raise typer.Exit()

    return typer.Option(False, "--version", callback=show, is_eager=True,
                        help="Print the version and exit.")
