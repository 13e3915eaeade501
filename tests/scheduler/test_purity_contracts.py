"""The step's purity is a contract, and the contract bites: a probe import written into a copy
of the tree breaks it (lint-imports run on the copy with the repository's own configuration),
and decide/ has no coroutine and imports no I/O module of the standard library."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DECIDE = ROOT / "src" / "persys" / "scheduler" / "decide"
LINT = Path(sys.executable).with_name("lint-imports")
# What decide/ may import from outside persys: data, typing and hashing (shards: rendezvous hashing),
# nothing that reaches out.
OUTSIDE_ALLOWED = {"__future__", "collections", "dataclasses", "typing", "json", "pydantic", "math", "enum",
                   "hashlib"}


def lint_copy(tmp_path: Path, probes: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of src/persys with `probes` (relative path -> source) written in."""
    shutil.copytree(ROOT / "src" / "persys", tmp_path / "persys", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, source in probes.items():
        (tmp_path / "persys" / rel).write_text(source)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    only = [c for c in config["contracts"] if c["type"] == "allow_list"]
    lines = ["[importlinter]", f"root_package = {config['root_package']}",
             "contract_types =", *(f"    {t}" for t in config["contract_types"])]
    for i, c in enumerate(only):
        lines += [f"[importlinter:contract:{i}]", f"name = {c['name']}", f"type = {c['type']}",
                  "source_modules =", *(f"    {m}" for m in c["source_modules"]),
                  "allowed_modules =", *(f"    {m}" for m in c["allowed_modules"])]
    ini = tmp_path / "contracts.ini"
    ini.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # the copy, ahead of the installed tree
    return subprocess.run([str(LINT), "--config", str(ini), "--no-cache"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


PROBES = {  # written into the copy together: one lint run must name each
    "scheduler/decide/probe_store.py": ("import persys.store.base\n",
                                        "persys.scheduler.decide.probe_store imports persys.store.base"),
    "scheduler/decide/probe_keys.py": ("from persys.scheduler.mirror import keys\n",
                                       "persys.scheduler.decide.probe_keys imports persys.scheduler.mirror.keys"),
    "scheduler/placement/probe_model.py": ("import persys.model\n",
                                           "persys.scheduler.placement.probe_model imports persys.model"),
}


@pytest.mark.slow  # copies the tree and runs lint-imports on it (15-40 s): not for the fast lane
def test_probe_imports_break_the_purity_contracts(tmp_path: Path) -> None:
    broken = lint_copy(tmp_path, {rel: source for rel, (source, _) in PROBES.items()})
    assert broken.returncode == 1, broken.stdout + broken.stderr
    said = " ".join(broken.stdout.split())
    for _, named in PROBES.values():
        assert named in said, broken.stdout
    assert "0 kept, 2 broken" in said


@pytest.mark.slow
def test_the_copy_without_a_probe_keeps_the_contracts(tmp_path: Path) -> None:
    kept = lint_copy(tmp_path, {})
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "2 kept, 0 broken" in kept.stdout


def test_decide_has_no_coroutine_and_no_io_import() -> None:
    files = sorted(DECIDE.glob("*.py"))
    assert len(files) > 5
    for f in files:
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            assert not isinstance(node, ast.AsyncFunctionDef | ast.Await), f"{f.name}:{node.lineno}: async in decide/"
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                tops = {(node.module or "").split(".")[0]}
            else:
                continue
            assert tops <= OUTSIDE_ALLOWED | {"persys"}, f"{f.name}:{node.lineno}: imports {tops}"
