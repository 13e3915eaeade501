"""persysctl's quick path for the read verbs typed while watching a cluster (#33, item 7): `logs
NAME`, `events` and `top`, with the same requests and the same bytes as the full client
(`cli.logs_cmd`, `cli.events_cmd`, `cli.ctl`'s `top`), with the standard library and
`quick_gateway.Gateway`.

Answered here:
- `logs NAME` with --instance, --tail/-n, --since, --service, --timestamps (not -f: a stream).
- `events` with --for/--subject/--object, --kind/-k (repeated or comma-separated), --node, --since
  as a duration (10m, 2h, 1d), --limit, -o table|json (not -f, --since-id: a stream).
- `top [workloads|nodes]` with -o table|text|wide|json (not --since: Persys Meter's).
- a command's --server and the global --token, --context, --server.

Anything else, a value the full client would refuse (it says why), a table `cli.plain_table`
cannot draw as rich does, and JSON on a terminal (rich colours it) go to the full client, after
nothing but a read was sent and nothing was printed.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any
from urllib.parse import urlencode

from persys.cli.output.listing_rows import KINDS
from persys.cli.quick.gateway import GLOBAL, FullClient, Gateway, QuickError, fail, terminal_width
from persys.cli.records import record

_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_DURATION = re.compile(r"^(\d{1,9})([smhd])$")  # as persys.events.filters (that package loads the event bus)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_SINCE_SECONDS = 366 * 86400
MAX_KINDS = 32

# Each verb's own options: option -> (key, takes a value); a key ending in "+" collects repeats.
_OPTIONS: dict[str, dict[str, tuple[str, bool]]] = {
    "logs": {"--instance": ("instance", True), "--tail": ("tail", True), "-n": ("tail", True),
             "--since": ("since", True), "--service": ("service", True), "--timestamps": ("timestamps", False),
             "--server": ("server", True)},
    "events": {"--for": ("subject", True), "--subject": ("subject", True), "--object": ("subject", True),
               "--kind": ("kind+", True), "-k": ("kind+", True), "--node": ("node", True),
               "--since": ("since", True), "--limit": ("limit", True), "-o": ("output", True),
               "--output": ("output", True), "--server": ("server", True)},
    "top": {"-o": ("output", True), "--output": ("output", True), "--server": ("server", True)},
}


@record
class ReadCommand:
    verb: str  # logs | events | top
    words: list[str]  # the positional words after the verb
    opts: dict[str, str] = {}
    kinds: list[str] = []  # events --kind, as given
    server: str | None = None
    context: str | None = None
    token: str | None = None


def _option(verb: str, a: str) -> tuple[str, bool, str | None] | None:
    """(key, takes a value, the value given with it) of option `a` before the verb (a global
    one) or after it (the verb's own); None when this path does not know it. Pure."""
    key, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
    if not verb:
        return (key[2:], True, value if eq else None) if key in GLOBAL else None
    own = _OPTIONS[verb]
    if key in own:
        return (*own[key], value if eq else None)
    if len(a) > 2 and a[:2] in own:  # -ojson, -n5, -kNodeReady
        return (*own[a[:2]], a[2:])
    return None


def _option_value(opt: tuple[str, bool, str | None], argv: list[str], i: int) -> tuple[str, int] | None:
    """An option's value and the index of the last word it used; None for a malformed option."""
    _, takes, value = opt
    if not takes:
        return None if value is not None else ("true", i)
    if value is not None:
        return value, i
    return None if i + 1 >= len(argv) else (argv[i + 1], i + 1)


def _keep(cmd: ReadCommand, glob: dict[str, str], name: str, value: str) -> None:
    """Where an option's value goes: a global option before the verb, the verb's after it."""
    if not cmd.verb:
        glob[name] = value
    elif name == "kind+":
        cmd.kinds.append(value)
    else:
        cmd.opts[name] = value


def _split(argv: list[str]) -> ReadCommand | None:
    """The verb, its words and options; None for a line the full client must read. Pure."""
    glob: dict[str, str] = {}
    cmd = ReadCommand(verb="", words=[])
    i = 0
    while i < len(argv):
        a = argv[i]
        opt = _option(cmd.verb, a)
        if opt is not None:
            taken = _option_value(opt, argv, i)
            if taken is None:
                return None
            value, i = taken
            _keep(cmd, glob, opt[0], value)
        elif a.startswith("-") or (not cmd.verb and a not in _OPTIONS):
            return None  # -f, --since-id, --help, an option of another verb, another verb
        elif not cmd.verb:
            cmd.verb = a
        else:
            cmd.words.append(a)
        i += 1
    if not cmd.verb:
        return None
    cmd.server = cmd.opts.pop("server", None) or glob.get("server")
    cmd.context = glob.get("context")
    cmd.token = glob.get("token") or os.environ.get("PERSYS_TOKEN") or None
    return cmd


def _int(text: str, low: int, high: int) -> int | None:
    return int(text) if text.isdigit() and low <= int(text) <= high else None


def logs_request(cmd: ReadCommand) -> str | None:
    """The URL `logs` asks for, None for the full client. Pure."""
    if len(cmd.words) != 1 or not _NAME.match(cmd.words[0]):
        return None
    tail = _int(cmd.opts.get("tail", "100"), 0, 10_000)
    if tail is None:
        return None
    query = {"instance": cmd.opts.get("instance", ""), "tail": str(tail), "since": cmd.opts.get("since", ""),
             "service": cmd.opts.get("service", ""), "timestamps": cmd.opts.get("timestamps", "false")}
    return f"/v1/workloads/{cmd.words[0]}/logs?{urlencode(query)}"


def events_request(cmd: ReadCommand) -> str | None:
    """The URL `events` asks for, None for the full client (which refuses a bad filter with its
    own message: these are `persys.events.filters.make_filter`'s rules). Pure."""
    o = cmd.opts
    subject, node, since = o.get("subject", ""), o.get("node", ""), o.get("since", "")
    kinds = sorted({k.strip() for item in cmd.kinds for k in item.split(",") if k.strip()})
    limit = _int(o.get("limit", "50"), 1, 10_000)
    if cmd.words or limit is None or o.get("output", "table") not in ("table", "json"):
        return None
    if len(kinds) > MAX_KINDS or not all(len(k) <= 64 and k.isalnum() for k in kinds):
        return None
    if subject and (len(subject) > 253 + 16 or ("/" not in subject and subject != "cluster")):
        return None
    if len(node) > 253 or any(c.isspace() or c == "/" for c in node):
        return None
    m = _DURATION.match(since)
    if since and (m is None or int(m.group(1)) * _UNIT[m.group(2)] > MAX_SINCE_SECONDS):
        return None  # an RFC 3339 time, or a refusal: the full client
    params: list[tuple[str, str]] = [(k, v) for k, v in (("subject", subject), ("node", node), ("since", since)) if v]
    params += [("kind", k) for k in kinds] + [("limit", str(limit))]
    return f"/v1/events?{urlencode(params)}"


def top_request(cmd: ReadCommand) -> str | None:
    """The URL `top` asks for, None for the full client. Pure."""
    if len(cmd.words) > 1 or cmd.opts.get("output", "table") not in ("table", "text", "wide", "json"):
        return None
    kind = KINDS.get((cmd.words or ["workloads"])[0].lower(), "")
    return f"/v1/{kind}" if kind in ("workloads", "nodes") else None


# --------------------------------------------------------------------------- printing



def table_text(header: tuple[str, ...], rows: list[list[str]], right: tuple[bool, ...] = ()) -> str:
    """A table as the full client's console draws it; FullClient when only rich can."""
    from persys.cli.output import plain_table

    width = terminal_width()
    bold = sys.stdout.isatty() and os.environ.get("TERM", "") not in ("dumb", "unknown")
    drawn = plain_table.render(header, rows, show_header=True, width=width or 0, bold=bold, right=right)
    if drawn is None:
        raise FullClient
    return drawn


def json_text(data: Any) -> str:
    """`data` as the full client's `print_json` prints it on a pipe (on a terminal rich colours it)."""
    from persys.cli.output.printed_doc import printed

    text = json.dumps(printed(data), indent=2, ensure_ascii=False)
    if sys.stdout.isatty() or not text.isascii() or "\x7f" in text:
        raise FullClient
    return text + "\n"


def events_text(items: list[dict[str, Any]], output: str) -> str:
    from persys.cli.output.usage_rows import EVENT_COLUMNS, event_cells

    if output == "json":
        return json_text(items)
    return table_text(EVENT_COLUMNS, [event_cells(e) for e in items])


def top_text(kind: str, items: list[dict[str, Any]], output: str) -> str:
    from persys.cli.output.usage_rows import top_cells, top_columns, top_rows

    rows = top_rows(kind, items)
    if output == "json":
        return json_text(rows)
    columns = top_columns(kind)
    return table_text(tuple(c for c, _ in columns), [top_cells(kind, r) for r in rows],
                      tuple(j == "right" for _, j in columns))


def logs_text(text: str) -> str:
    return text if text.endswith("\n") or not text else text + "\n"


# --------------------------------------------------------------------------- entry


def parse(argv: list[str]) -> tuple[ReadCommand, str] | None:
    """The command and the URL it asks for, or None for the full client. Pure."""
    cmd = _split(argv)
    if cmd is None:
        return None
    url = {"logs": logs_request, "events": events_request, "top": top_request}[cmd.verb](cmd)
    return None if url is None else (cmd, url)


def run(argv: list[str]) -> bool:
    """Answer a logs, events or top here; False when the full client must (only a read was
    sent then, and nothing printed)."""
    parsed = parse(argv)
    if parsed is None:
        return False
    cmd, url = parsed
    try:
        answer = Gateway(cmd).request("GET", url)
        output = cmd.opts.get("output", "table")
        if cmd.verb == "logs":
            text = logs_text(answer["text"])
        elif cmd.verb == "events":
            text = events_text(answer, output)
        else:
            text = top_text(url.rpartition("/")[2], answer, output)
        sys.stdout.write(text)
        sys.stdout.flush()
    except FullClient:
        return False
    except QuickError as e:
        fail(str(e))
    return True
