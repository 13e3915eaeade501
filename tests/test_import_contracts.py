"""The import contracts in pyproject.toml hold their promise: each fails when a probe import is
added where it forbids one (a copy of the package in a temporary folder, lint-imports run on it
with the project's own contracts), and every top-level package (and every package of the
scheduler) sits in a layer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "persys"
LINT = Path(sys.executable).with_name("lint-imports")

# module (path under persys/) -> the line appended, the contract it breaks, and the illegal import
# its report names.
PROBES = [
    ("scheduler/decide/liveness.py", "import grpc",
     "Only the gRPC edges import grpc and the generated code", "persys.scheduler.decide.liveness -> grpc"),
    ("scheduler/decide/reconcile.py", "from persys.scheduler.rpc import agent_control",  # grpc through a servicer
     "Decisions reach no gRPC, store client",
     "persys.scheduler.decide.reconcile -> persys.scheduler.rpc.agent_control"),
    ("agent/decide/merge.py", "from persys._pb.persys.v1 import control_pb2",
     "Only the gRPC edges import grpc and the generated code", "persys.agent.decide.merge -> persys._pb"),
    ("scheduler/decide/liveness.py", "from persys.store import etcd",
     "Only the store opens its backends", "persys.scheduler.decide.liveness -> persys.store.etcd"),
    ("scheduler/views/documents.py", "import redis",
     "Only the event log and the sampler speak to Redis", "persys.scheduler.views.documents -> redis"),
    ("agent/decide/merge.py", "import asyncio",
     "Decisions import no event loop themselves", "persys.agent.decide.merge -> asyncio"),
    ("scheduler/decide/drift.py", "from persys.scheduler.mirror import follower",
     "reach no event loop at all", "persys.scheduler.decide.drift -> persys.scheduler.mirror.follower"),
    ("scheduler/work/delivery.py", "import grpc",  # only rpc/ speaks gRPC in the scheduler
     "Only the gRPC edges import grpc and the generated code", "persys.scheduler.work.delivery -> grpc"),
    ("scheduler/mirror/keys.py", "from persys.scheduler.rpc import status",  # a low package reaching up
     "Scheduler packages: each imports only the packages below it",
     "persys.scheduler.mirror.keys -> persys.scheduler.rpc.status"),
    ("policy/check.py", "from persys.scheduler.mirror import keys",
     "Layers: a module imports only from layers below its own", "persys.policy.check -> persys.scheduler.mirror.keys"),
]


def contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]  # type: ignore[no-any-return]


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    # The tree's root too: the allow-list contract type lives in scripts/import_contracts.py.
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{tree}", "COLUMNS": "500"}
    return subprocess.run([str(LINT), "--config", str(tree / "pyproject.toml"), "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package and the project's contracts, linted as they are first."""
    root = tmp_path_factory.mktemp("contracts")
    shutil.copytree(PACKAGE, root / "src" / "persys", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "import_contracts.py", root / "scripts" / "import_contracts.py")
    clean = lint(root)
    assert clean.returncode == 0, f"the copy does not lint clean:\n{clean.stdout}\n{clean.stderr}"
    assert f"Contracts: {len(contracts())} kept, 0 broken" in clean.stdout
    # The copy is what is linted, not the installed package.
    assert str(root) in subprocess.run([sys.executable, "-c", "import persys; print(persys.__file__)"],
                                       env={**os.environ, "PYTHONPATH": str(root / "src")},
                                       capture_output=True, text=True, check=True, timeout=60).stdout
    return root


def test_every_probe_import_breaks_its_contract(tree: Path) -> None:
    for module, line, _, _ in PROBES:
        with (tree / "src" / "persys" / module).open("a") as f:
            f.write(f"\n{line}  # probe\n")
    out = lint(tree)
    assert out.returncode != 0, out.stdout
    report = out.stdout
    for module, line, contract, illegal in PROBES:
        broken = [ln for ln in report.splitlines() if contract in ln and " BROKEN" in ln]
        assert broken, f"{line!r} in {module} did not break {contract!r}:\n{report}"
        assert illegal in report, f"{contract!r} does not name {illegal!r}:\n{report}"


def test_every_top_level_package_sits_in_a_layer() -> None:
    layers = next(c for c in contracts() if c["type"] == "layers" and c.get("containers") == ["persys"])
    placed = {name.strip() for layer in layers["layers"] for name in str(layer).split("|")}  # type: ignore[attr-defined]
    top = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    top |= {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert top - placed == set(), f"in no layer of the layers contract: {sorted(top - placed)}"
    assert placed - top == set(), f"layers name what does not exist: {sorted(placed - top)}"


def test_every_scheduler_package_sits_in_a_layer() -> None:
    """A new package (or module) of persys.scheduler is placed in the scheduler's layers on purpose."""
    layers = next(c for c in contracts() if c["type"] == "layers" and c.get("containers") == ["persys.scheduler"])
    placed = {name.strip() for layer in layers["layers"] for name in str(layer).split("|")}  # type: ignore[attr-defined]
    scheduler = PACKAGE / "scheduler"
    here = {p.name for p in scheduler.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    here |= {p.stem for p in scheduler.glob("*.py") if p.name != "__init__.py"}
    assert here - placed == set(), f"in no layer of the scheduler's packages: {sorted(here - placed)}"
    assert placed - here == set(), f"the scheduler's layers name what does not exist: {sorted(placed - here)}"
