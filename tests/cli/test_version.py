"""Both binaries answer --version with the version and what they run on."""

from __future__ import annotations

import re

from typer.testing import CliRunner

import persys
from persys.cli.ctl import app as persysctl
from persys.cli.server import app as persys_app


def test_version_of_both_binaries() -> None:
    for app, name in ((persysctl, "persysctl"), (persys_app, "persys")):
        r = CliRunner().invoke(app, ["--version"])
        assert r.exit_code == 0, r.output
        assert re.fullmatch(rf"{name} {re.escape(persys.__version__)} \(python [\d.]+, grpcio [\d.]+, \w+/\w+\)\n",
                            r.stdout), r.stdout
