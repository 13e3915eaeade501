"""persys.agent.decide holds decisions only: no coroutine, no await, anywhere in it (the import
contracts in pyproject.toml keep I/O modules out; this keeps the event loop out of its code)."""

from __future__ import annotations

import ast
from pathlib import Path

import persys.agent.decide

PACKAGE = Path(persys.agent.decide.__file__).parent


def test_no_async_code_in_decide() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert {m.stem for m in modules} >= {"merge", "plan", "report", "disconnect"}
    found = [f"{m.name}:{node.lineno}" for m in modules for node in ast.walk(ast.parse(m.read_text()))
             if isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncFor | ast.AsyncWith)]
    assert found == [], f"async code in persys.agent.decide: {found}"
