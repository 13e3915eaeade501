"""Every dotted `persys.<package>...` path written in code, scripts and docs names a module that
exists, and when it goes on past a module, a name that module's source mentions.

Modules move between packages (issue #32); mypy follows imports, but not the dotted paths in
strings (`python -m persys.cli...`, import-linter contracts, subprocess commands) or in the docs
a newcomer reads: this test does."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
TOKEN = re.compile(r"(?<![\w./-])persys(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
WHERE = ("src/**/*.py", "tests/**/*.py", "bench/**/*.py", "scripts/**/*", "docs/**/*.md", "*.md",
         "pyproject.toml", ".ci/*")
# Dotted names that are not module paths although they start like one: trace span attributes
# (docs/observability.md), the import-contract test's probe modules (written at test time) and the
# server entry point of revisions before cli/ was split (bench/scale's --compare runs those).
NOT_MODULES = {"persys.cli.server", "persys.store.committed", "persys.store.ops", "persys.scheduler.decide.probe_keys",
               "persys.scheduler.decide.probe_store", "persys.scheduler.placement.probe_model"}


def _module_file(parts: list[str]) -> Path | None:
    p = SRC.joinpath(*parts)
    for f in (p.with_suffix(".py"), p / "__init__.py"):
        if f.is_file():
            return f
    return None


def _problem(ref: str) -> str | None:
    parts = ref.split(".")
    if ref in NOT_MODULES or _module_file(parts[:2]) is None:
        return None  # a label, span attribute or file name (persys.yaml), not a module path
    i = len(parts)
    while _module_file(parts[:i]) is None:
        i -= 1
    rest = parts[i:]
    if not rest or rest[0].startswith("__"):
        return None
    found = _module_file(parts[:i])
    assert found is not None
    return None if re.search(rf"\b{re.escape(rest[0])}\b", found.read_text()) else ref


def test_every_dotted_module_path_exists() -> None:
    files = {f for pattern in WHERE for f in ROOT.glob(pattern)
             if f.is_file() and "_pb" not in f.parts and ".venv" not in f.parts}
    assert len(files) > 100, "the globs found too little: run from a checkout"
    bad = sorted({f"{f.relative_to(ROOT)}: {m.group(0)}" for f in files
                  for m in TOKEN.finditer(f.read_text(errors="replace")) if _problem(m.group(0))})
    assert not bad, "dotted paths naming no module (moved or renamed?):\n" + "\n".join(bad)


def test_every_source_file_path_in_docs_and_comments_exists() -> None:
    """`scheduler/decide/reconcile.py` or `src/persys/cli/ctl.py` in a doc or a comment: that file exists."""
    pkg = SRC / "persys"
    tops = sorted(p.name for p in pkg.iterdir() if (p / "__init__.py").is_file())
    path = re.compile(r"(?<![\w./-])(?:src/persys/)?((?:" + "|".join(tops) + r")/[\w/]*\w\.py)\b")
    files = [f for pattern in ("docs/**/*.md", "*.md", "src/**/*.py") for f in ROOT.glob(pattern)
             if "_pb" not in f.parts]
    seen = [(f, m.group(1)) for f in files for m in path.finditer(f.read_text(errors="replace"))]
    assert len(seen) > 20, "no file paths found: the pattern is wrong"
    bad = sorted({f"{f.relative_to(ROOT)}: {p}" for f, p in seen if not (pkg / p).is_file()})
    assert not bad, "file paths naming no file (moved or renamed?):\n" + "\n".join(bad)
