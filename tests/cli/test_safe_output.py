"""persysctl prints node-supplied text escaped: no raw terminal escapes, no rich markup."""

from __future__ import annotations

import io

from rich.console import Console

from persys.cli.ctl import app as ctl
from persys.cli.output import listing_rows, plain_table
from persys.cli.output.describe_text import node_text
from persys.cli.output.safe_text import printable


def rendered(table: object) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, force_terminal=True).print(table)
    return buf.getvalue()


def test_tables_escape_node_supplied_text() -> None:
    workloads = [{"name": "w", "type": "process", "ready": "0/1", "phase": "Failed", "node": "n1",
                  "revision": "r1", "reason": "boom\x1b]0;owned\x07[bold]x[/bold]"}]
    text = rendered(ctl._table("workloads", workloads))
    assert "\x07" not in text and "]0;owned" in text and "\\x1b]0;owned\\x07[bold]x[/bold]" in text
    nodes = [{"id": "n1", "status": "Ready", "capabilities": {"runtimes": {"do\x1b[2Jcker": {}}}}]
    text = rendered(ctl._table("nodes", nodes))
    assert "\x1b[2J" not in text and "do\\x1b[2Jcker" in text


def test_the_quick_paths_rows_are_escaped_too() -> None:
    rows = [listing_rows.row("nodes", {"id": "n\x1b[2J1", "status": "Ready\u202e"}, wide=True)]
    text = plain_table.render(listing_rows.columns("nodes", True), rows, show_header=True, width=250)
    assert text is not None and "\x1b" not in text and "\u202e" not in text
    assert "n\\x1b[2J1" in text and "Ready\\u202e" in text


def test_describe_node_escapes_labels_and_version() -> None:
    node = {"id": "n1", "status": "Ready", "agentVersion": "1\x1b[8m", "labels": {"zone": "a\u202eb"}}
    text = printable(node_text(node), keep_newlines=True)
    assert "\x1b" not in text and "\u202e" not in text
    assert "1\\x1b[8m" in text and "a\\u202eb" in text and text.count("\n") == node_text(node).count("\n")
