"""`persysctl events`: recent cluster events, filtered, and with --follow the live stream."""

from __future__ import annotations

import json
import time
from typing import Any

import typer
import yaml
from rich.table import Table
from rich.text import Text

from persys.cli.ctl.api import Api, OutputOpt, ServerOpt, age_text, emit, fail, out
from persys.cli.ctl.follow import follow_events
from persys.cli.output.printed_doc import printed
from persys.cli.output.safe_text import printable
from persys.cli.output.usage_rows import EVENT_COLUMNS, event_cells

HELP = (
    "Show cluster events (NodeJoined, WorkloadScheduled, WorkloadFailed, ...), newest last.\n\n"
    "Filters (all optional, combined): --kind (repeat or comma-separate), --for/--subject/--object "
    "workload/web, --node n1 (events about the node or naming it), --since 10m | 2h | 1d | RFC 3339.\n\n"
    "With -f/--follow, keep printing events as they happen (Ctrl-C ends). A dropped connection is retried "
    "and resumed after the last event shown, so none is lost or shown twice; --since-id ID resumes after a "
    "given event (as `-o json` shows it).\n\n"
    "Examples:\n\n"
    "  persysctl events --kind WorkloadFailed,PlacementFailed --since 1h\n\n"
    "  persysctl events -f --node n1\n\n"
    "  persysctl events -f --since-id 1767000000000-0 -o json"
)


def _line(e: dict[str, Any]) -> str:
    return printable(f"{age_text(e['ts']):>5}  {e['kind']:<18} {e['subject']:<28} {e['message']}")


def _show(output: str) -> Any:
    def show(e: dict[str, Any]) -> None:
        if output == "json":
            print(json.dumps(printed(e)), flush=True)  # one object per line: a stream, not one document
        elif output == "yaml":
            print("---\n" + yaml.safe_dump(printed(e), sort_keys=False).rstrip(), flush=True)
        else:
            out.print(_line(e), markup=False, highlight=False)

    return show


def _list_events(api: Api, params: dict[str, Any], limit: int, output: str) -> None:
    """The last `limit` events matching the filter, as a table (or -o json|yaml)."""
    items = api.request("GET", "/v1/events", params={**params, "limit": limit})
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in EVENT_COLUMNS:
        t.add_column(col, overflow="fold")
    for e in items:  # Text: a message is shown as it is, never read as markup or emoji codes
        t.add_row(*map(Text, event_cells(e)))
    emit(items, output, t)


def events_command(
    subject: str = typer.Option("", "--for", "--subject", "--object",
                                help="Only events about this object, e.g. workload/web or node/n1."),
    kind: list[str] = typer.Option([], "--kind", "-k", help="Only these kinds (repeat or comma-separate)."),
    node: str = typer.Option("", "--node", help="Only events about this node or naming it."),
    since: str = typer.Option("", "--since", help="Only events since: 10m, 2h, 1d or an RFC 3339 time."),
    since_id: str = typer.Option("", "--since-id", help="Follow from just after this event id (implies -f)."),
    limit: int = typer.Option(50, "--limit", min=1, max=10_000, help="How many to list, newest last."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing events as they happen."),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    from persys.events.filters import FilterError, check_id, make_filter, parse_since

    if output not in ("table", "json", "yaml"):
        fail(f"unknown output format {output!r} (use table, json or yaml)")
    try:  # checked here too: a bad filter is one line, before anything is asked
        flt = make_filter(kind, subject, node)
        if since:
            parse_since(since, time.time(), "--since")
        if since_id:
            check_id(since_id, "--since-id")
    except FilterError as err:
        fail(str(err).replace("sinceId:", "--since-id:"))
    params: dict[str, Any] = {k: v for k, v in (("subject", subject), ("node", node), ("since", since)) if v}
    if flt.kinds:
        params["kind"] = sorted(flt.kinds)
    api = Api(server)
    if not (follow or since_id):
        _list_events(api, params, limit, output)
        return
    show = _show(output)
    start = since_id
    if not since_id and not since:
        # Recent history first, then the stream from the last one shown.
        for e in api.request("GET", "/v1/events", params={**params, "limit": limit}):
            show(e)
            start = e["id"]
    follow_events(api, params, start, show)
