"""The tables `get` prints, drawn without rich: the layout rich gives `Table(box=None,
pad_edge=False)` when every cell fits on its line (columns as wide as their widest cell, two
spaces between them, cells padded to their column's width).

Only ASCII text whose table fits the width is drawn here; anything else (wide characters,
folding to a narrow terminal, a column with no text at all) returns None and the caller draws it with rich, so the two
clients never disagree on a layout. Pure."""

from __future__ import annotations

from collections.abc import Sequence

BOLD, RESET = "\x1b[1m", "\x1b[0m"


def render(header: Sequence[str], rows: Sequence[Sequence[str]], *, show_header: bool, width: int,
           bold: bool = False, right: Sequence[bool] = ()) -> str | None:
    """The table as text (lines ending in a newline), or None when rich must draw it. `right`:
    which columns are right-aligned (rich's justify="right"), header included."""
    shown = [list(header)] if show_header else []
    cells = shown + [list(r) for r in rows]
    if any(len(r) != len(header) for r in cells):
        raise ValueError("every row needs one cell per column")
    if not all(c.isascii() and c.isprintable() for r in cells for c in r):
        return None
    widths = [max((len(r[i]) for r in cells), default=0) for i in range(len(header))]
    if 0 in widths or sum(widths) + 2 * (len(widths) - 1) > width:  # rich gives an empty column a width
        return None
    aligned = [*right, *[False] * (len(header) - len(right))]
    lines = ["  ".join(c.rjust(w) if r_ else c.ljust(w) for c, w, r_ in zip(r, widths, aligned, strict=True))
             for r in cells]
    if show_header and bold:
        lines[0] = BOLD + lines[0] + RESET
    return "".join(line + "\n" for line in lines)
