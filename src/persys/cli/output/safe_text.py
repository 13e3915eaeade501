"""Text from the cluster made safe for a terminal: nodes (and workloads) supply some of it, and a
raw escape sequence could rewrite the screen, hide lines or set the window title."""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich loads only where a table is drawn (cli.quick.entry prints without it)
    from rich.text import Text


def _escaped(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, keep_newlines: bool = False) -> str:
    """`text` with control and format characters written as escapes (`\\x1b`, `\\u202e`)."""
    return "".join(
        c if (c == "\n" and keep_newlines) or unicodedata.category(c) not in ("Cc", "Cf", "Cs", "Co", "Cn")
        else _escaped(c)
        for c in text
    )


def cell(value: object) -> Text:
    """A table cell: printable, and never read as rich markup (`[bold]` stays literal)."""
    from rich.text import Text

    return Text(printable(str(value)))
