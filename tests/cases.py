"""The one YAML case loader for table-driven tests (`*_cases` folders and `*_cases.yaml` files).

    from tests.cases import load, params
    CASES = load(__file__, "copy_cases/copy.yaml")          # the document as YAML gives it
    @pytest.mark.parametrize("case", params(__file__, "copy_cases/copy.yaml"), ...)  # one param a case

`load` resolves the path against the test module's folder (pass `__file__`) or a cases folder; `params` turns a
list of cases (or the list under `key` in each of several files, given a glob) into pytest params
named by each case's `name` (or `id`), prefixed with the file's stem when a glob names files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

# libyaml's parser when PyYAML was built with it (the wheels are): the same safe constructors,
# ~10x faster. The cases are read at collection, by every xdist worker: the pure-Python parser
# was a quarter of the fast lane's collection (15 s of 51 s profiled).
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_LOADER)  # a safe loader, C or Python


def _path(where: str | Path, relative: str) -> Path:
    where = Path(where).resolve()
    base = where if where.is_dir() else where.parent
    return base / relative if relative else where


def load(where: str | Path, relative: str = "") -> Any:
    """The YAML document at `relative` to `where`: a test module's `__file__` (its folder) or a
    cases folder; `load(path)` alone reads that file."""
    return _yaml(_path(where, relative).read_text())


def _case_id(case: Any, index: int) -> str:
    if isinstance(case, dict):
        for field in ("name", "id"):
            if field in case:
                return str(case[field])
    return str(index)


def params(module_file: str | Path, relative: str, key: str | None = None) -> list[Any]:
    """One pytest param per case: `relative` is a file or a glob (`scenarios/*.yaml`); `key` picks
    the list inside each document (else the document is the list)."""
    base = _path(module_file, ".")
    files = sorted(base.glob(relative)) if any(c in relative for c in "*?[") else [base / relative]
    assert files, f"no case files match {relative} in {base}"
    out = []
    for f in files:
        doc = _yaml(f.read_text())
        cases = doc[key] if key is not None else doc
        prefix = f"{f.stem}:" if len(files) > 1 or f != base / relative else ""
        out += [pytest.param(c, id=prefix + _case_id(c, i)) for i, c in enumerate(cases)]
    return out
