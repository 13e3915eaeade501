"""--strict-skips, pure and for real: undeclared skips are named, declared ones pass, and a pytest
run with an undeclared skip fails while the same run without the switch passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.skip_guard import ALLOWED_FILE, allowed_patterns, unexpected

ROOT = Path(__file__).resolve().parents[1]
UNUSED_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:schemathesis", "-p", "no:xdist", "-p", "no:anyio")


def test_declared_skips_pass_others_are_named() -> None:
    patterns = allowed_patterns(ALLOWED_FILE.read_text())
    skips = [("tests/agent/runtimes/test_firecracker_api.py::test_real_binary", "no firecracker binary on PATH"),
             ("tests/storage/test_local.py::test_contract[relocate]", "node-bound data: no second node can reach it"),
             ("tests/e2e/test_cluster.py::test_x", "etcd binary not found on PATH")]
    assert unexpected(skips, patterns) == ["tests/e2e/test_cluster.py::test_x: etcd binary not found on PATH"]


def test_a_run_with_an_undeclared_skip_fails(tmp_path: Path) -> None:
    probe = ROOT / "tests" / f"test_zz_skip_probe_{tmp_path.name}.py"
    probe.write_text("import pytest\n\ndef test_gone():\n    pytest.skip('redis-server binary not found on PATH')\n")
    runs: list[subprocess.Popen[str]] = []
    try:
        # The two runs at once, without the plugins the probe does not use (Hypothesis and
        # Schemathesis alone are three quarters of a run's CPU): 12 s of the fast lane was these.
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *UNUSED_PLUGINS, str(probe)]
        for argv in (args, [*args, "--strict-skips"]):
            runs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT))
        (plain, plain_out), (strict, strict_out) = [(run, run.communicate(timeout=120)[0]) for run in runs]
    finally:
        for run in runs:
            run.kill()  # after a timeout; a no-op on a run that ended
            run.wait()
        probe.unlink()
    assert plain.returncode == 0, plain_out
    assert strict.returncode == 1 and "redis-server binary not found on PATH" in strict_out, strict_out
