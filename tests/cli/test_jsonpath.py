"""`-o jsonpath=`: kubectl's template subset (persys.cli.output.jsonpath), table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from persys.cli.output.jsonpath import TEMPLATE_MAX_CHARS, TemplateError, render

LIST = {"items": [
    {"name": "web", "phase": "Running", "labels": {"app": "web"}, "nodes": ["n1", "n2"], "ready": True},
    {"name": "db", "phase": "Pending", "labels": {}, "nodes": [], "restarts": 2},
]}

CASES: list[tuple[str, Any, str]] = [
    ("{.items[*].name}", LIST, "web db"),
    ("{.items[0].phase}", LIST, "Running"),
    ("{.items[-1].name}", LIST, "db"),
    ("{.items[5].name}", LIST, ""),  # out of range: nothing
    ('{range .items[*]}{.name}{"\\t"}{.phase}{"\\n"}{end}', LIST, "web\tRunning\ndb\tPending\n"),
    ("{range .items[*]}{.name}={.restarts};{end}", LIST, "web=;db=2;"),  # a missing field prints nothing
    ("{.items[0].labels}", LIST, '{"app": "web"}'),
    ("{.items[0].ready}", LIST, "true"),
    ("{.items[*].nodes[*]}", LIST, "n1 n2"),
    ("names: {.items[*].name}!", LIST, "names: web db!"),
    ("{range .items[*]}[{range .nodes[*]}{@} {end}]{end}", LIST, "[n1 n2 ][]"),
    ("{range .none[*]}x{end}done", LIST, "done"),
    ("{.name}", {"name": "one"}, "one"),
    ("{'a}b'}", {}, "a}b"),
    ("{@}", 3, "3"),
]


@pytest.mark.parametrize(("template", "data", "want"), CASES, ids=[c[0] for c in CASES])
def test_render(template: str, data: Any, want: str) -> None:
    assert render(template, data) == want


@pytest.mark.parametrize(("template", "problem"), [
    ("{.items[*].name", "unclosed '{'"),
    ("{range .items[*]}{.name}", "{range} without {end}"),
    ("{.name}{end}", "{end} without {range}"),
    ("{.items(0)}", "cannot read '(0)'"),
    ("{" * (TEMPLATE_MAX_CHARS + 1), "longer than"),
])
def test_refused(template: str, problem: str) -> None:
    with pytest.raises(TemplateError) as exc:
        render(template, LIST)
    assert problem in str(exc.value)
