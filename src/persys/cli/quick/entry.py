"""persysctl's entry point: the commands run most often, answered without the full client.

`persysctl get workloads` is typed all day; the full client (typer's command tree, rich, httpx)
takes ~0.25 s to load before it sends a byte. This path answers `--version`, `get
workloads|nodes` (no name, no selector, no watch; -o table|wide|json|name; --node, --chunk-size,
--server, --context, --token), `describe workload|node NAME` and `delete workload NAME`
(`cli.quick.verbs`), `apply -f FILE` (`cli.quick.apply`), `logs`, `events` and `top`
(`cli.quick.reads`) with the standard library: one mutual-TLS HTTP/1.1 connection, the rows of
`cli.output.listing_rows`, tables from `cli.output.plain_table`. Anything else, any option it does not know,
and tracing switched on (`OTEL_EXPORTER_OTLP_*`) go to `cli.ctl.app.main` unchanged, and so does
drawing a table it cannot draw exactly as rich would. The two paths print the same bytes for the
same answer (tests/cli/test_quick_path.py and test_quick_verbs.py compare them).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from persys.cli.quick.gateway import GLOBAL, FullClient, Gateway, QuickError, fail, option_value, terminal_width
from persys.cli.records import record

OUTPUTS = ("table", "text", "wide", "json", "name")
TRACING_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# Settings that change how rich draws (styles on a pipe, a forced terminal): the full client then.
RICH_VARS = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


@record
class GetCommand:
    kind: str  # workloads or nodes
    output: str = "table"
    node: str = ""
    chunk: int = 500
    server: str | None = None
    context: str | None = None
    token: str | None = None


def parse(argv: list[str]) -> GetCommand | None:
    """The `get` this path answers, or None for the full client. Pure."""
    opts: dict[str, str] = {}
    words: list[str] = []
    names = {"--token": "token", "--context": "context", "--server": "server", "--node": "node",
             "-o": "output", "--output": "output", "--chunk-size": "chunk"}
    i = 0
    while i < len(argv):
        a = argv[i]
        key, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
        if key in names:
            i, given = option_value(argv, i, eq, value)
            if given is None:
                return None
            value = given
            after = bool(words)  # the command's own options come after it, the global ones before
            if (key in ("--token", "--context") and after) or (key not in GLOBAL and not after):
                return None  # misplaced: the full client says what is wrong
            opts[names[key]] = value
        elif a.startswith("-o") and len(a) > 2 and words[:1] == ["get"]:
            opts["output"] = a[2:]
        elif a.startswith("-"):
            return None  # -l, -w, --help, --version after a command, ...
        else:
            words.append(a)
        i += 1
    from persys.cli.output.listing_rows import KINDS

    kind = KINDS.get(words[1].lower(), "") if len(words) == 2 and words[0] == "get" else ""
    if kind not in ("workloads", "nodes"):
        return None
    output = opts.get("output", "table")
    chunk = opts.get("chunk", "500")
    if output not in OUTPUTS or not chunk.isdigit() or not 1 <= int(chunk) <= 5000:
        return None  # yaml, jsonpath and refusals: the full client
    if opts.get("node") and kind != "workloads":
        return None
    return GetCommand(kind=kind, output=output, node=opts.get("node", ""), chunk=int(chunk),
                      server=opts.get("server"), context=opts.get("context"),
                      token=opts.get("token") or os.environ.get("PERSYS_TOKEN") or None)


# --------------------------------------------------------------------------- transport


# --------------------------------------------------------------------------- output



def print_pages(cmd: GetCommand, got: Iterator[list[dict[str, Any]]]) -> None:
    from persys.cli.output import listing_rows, plain_table

    write = sys.stdout.write
    width = terminal_width()
    bold = sys.stdout.isatty() and os.environ.get("TERM", "") not in ("dumb", "unknown")
    wide = cmd.output == "wide"
    count = 0
    for items in got:
        if not items:
            continue
        if cmd.output == "json":
            from persys.cli.output.printed_doc import printed

            text = ",\n".join(json.dumps(i, indent=2) for i in printed(items))
            write(("[\n" if count == 0 else ",\n") + text)
        elif cmd.output == "name":
            write("".join(listing_rows.name_line(cmd.kind[:-1], i) + "\n" for i in items))
        else:
            header = listing_rows.columns(cmd.kind, wide)
            rows = [listing_rows.row(cmd.kind, i, wide) for i in items]
            drawn = plain_table.render(header, rows, show_header=count == 0, width=width or 0, bold=bold)
            if drawn is None:
                _print_with_rich(header, rows, show_header=count == 0)
            else:
                write(drawn)
        sys.stdout.flush()
        count += len(items)
    if cmd.output == "json":
        write("\n]\n" if count else "[]\n")
    elif not count and cmd.output != "name":
        write(f"No {cmd.kind} found.\n")


def _print_with_rich(header: tuple[str, ...], rows: list[list[str]], show_header: bool) -> None:
    """A table only rich draws right (wide characters, folding to the terminal): drawn by the
    full client's console, as it would have."""
    from rich.table import Table
    from rich.text import Text

    from persys.cli.ctl.api import out

    t = Table(box=None, header_style="bold", pad_edge=False, show_header=show_header)
    for col in header:
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(*map(Text, r))
    out.print(t)


# --------------------------------------------------------------------------- entry


def run(argv: list[str]) -> bool:
    """Answer `argv` here; False when the full client must."""
    if any(os.environ.get(v) for v in TRACING_VARS):
        return False  # a traced command: the full client makes its span
    if any(v in os.environ for v in RICH_VARS):
        return False
    if argv == ["--version"]:
        from persys.cli.version import version_text

        sys.stdout.write(version_text("persysctl") + "\n")
        return True
    cmd = parse(argv)
    if cmd is None:
        from persys.cli.quick import apply as quick_apply
        from persys.cli.quick import reads as quick_reads
        from persys.cli.quick import verbs as quick_verbs

        return quick_verbs.run(argv) or quick_apply.run(argv) or quick_reads.run(argv)
    try:
        gw = Gateway(cmd)
        from persys.cli.output.listing_rows import pages

        print_pages(cmd, pages(gw.get, cmd.kind, cmd.node, cmd.chunk))
    except FullClient:
        return False
    except QuickError as e:
        fail(str(e))
    return True


def main() -> None:
    try:
        if run(sys.argv[1:]):
            return
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `persysctl get workloads | head`: nothing more to say, and no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except Exception as e:  # a bug must still end in one line, not a traceback
        fail(f"unexpected {type(e).__name__}: {e} (please report this)")
    from persys.cli.ctl.app import main as full_client

    full_client()
