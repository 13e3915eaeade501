"""Both binaries answer --version with the version and what they run on."""

from __future__ import annotations

import re

from typer.testing import CliRunner

import persys
from persys.cli.ctl.app import app as persysctl
from persys.cli.servers.app import app as persys_app


def test_version_of_both_binaries() -> None:
    for app, name in ((persysctl, "persysctl"), (persys_app, "persys")):
        r = CliRunner().invoke(app, ["--version"])
        assert r.exit_code == 0, r.output
        assert re.fullmatch(rf"{name} {re.escape(persys.__version__)} \(python [\d.]+, grpcio [\d.]+, \w+/\w+\)\n",
                            r.stdout), r.stdout


def test_bash_completion_completes_commands() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "_PERSYSCTL_COMPLETE": "complete_bash", "COMP_WORDS": "persysctl ap", "COMP_CWORD": "1"}
    out = subprocess.run([str(Path(sys.executable).parent / "persysctl")], env=env, capture_output=True, text=True,
                         timeout=60).stdout
    assert out.split() == ["apply"], out
