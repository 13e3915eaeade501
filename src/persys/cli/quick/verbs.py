"""persysctl's quick path for `describe workload|node NAME` (text) and `delete workload NAME`
(with its --wait polling): the same requests and the same bytes as the full client (`cli.ctl.app`'s
`describe` and `delete`), with the standard library and `quick.Gateway`.

Answered here: `describe KIND NAME` or `describe KIND/NAME` for a workload or a node, -o text
(the default); `delete KIND NAME` or `delete KIND/NAME` for a workload, with --wait/--no-wait and
--timeout; a command's --server and the global --token, --context, --server. Anything else (other
kinds, -o json|yaml, -f, -l, --force, a name that is not a plain name) is the full client's, as
is a line rich would have changed (an emoji code like `:warning:` in a message, when rich's own
replacement cannot be loaded).

`apply -f FILE` has its own quick path (`cli.quick.apply`): the gateway validates, and a manifest
it refuses goes to the full client, which validates locally and prints its usual message.
"""

from __future__ import annotations

import os
import re
import sys
import time

from persys.cli.output.listing_rows import KINDS
from persys.cli.quick.gateway import GLOBAL, FullClient, Gateway, QuickError, fail
from persys.cli.records import record

# A name the quick path puts in a URL as it is; anything else goes to the full client.
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_SECONDS = re.compile(r"^[0-9]{1,6}(\.[0-9]{1,6})?$")
POLL_FIRST, POLL_MAX = 0.05, 0.25  # delete --wait: soon after the request, then as the full client


@record
class VerbCommand:
    verb: str  # describe | delete
    kind: str  # workloads | nodes
    name: str
    wait: bool = True
    timeout: float = 60.0
    server: str | None = None
    context: str | None = None
    token: str | None = None


def _split(argv: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """The words and the options of a command line, None for one the full client must read."""
    opts: dict[str, str] = {}
    words: list[str] = []
    names = {"--token": "token", "--context": "context", "--server": "server", "-o": "output",
             "--output": "output", "--timeout": "timeout"}
    i = 0
    while i < len(argv):
        a = argv[i]
        key, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
        after = bool(words)  # the command's own options come after it, the global ones before
        if key in names:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                i += 1
                value = argv[i]
            if (key in ("--token", "--context") and after) or (key not in GLOBAL and not after):
                return None  # misplaced: the full client says what is wrong
            opts[names[key]] = value
        elif a in ("--wait", "--no-wait") and after:
            opts["wait"] = "no" if a == "--no-wait" else "yes"
        elif a.startswith("-o") and len(a) > 2 and after:
            opts["output"] = a[2:]
        elif a.startswith("-"):
            return None  # -f, -l, --force, --help, ...
        else:
            words.append(a)
        i += 1
    return words, opts


def parse(argv: list[str]) -> VerbCommand | None:
    """The `describe` or `delete` this path answers, or None for the full client. Pure."""
    split = _split(argv)
    if split is None:
        return None
    words, opts = split
    if not words or words[0] not in ("describe", "delete"):
        return None
    verb, rest = words[0], words[1:]
    if len(rest) == 1 and rest[0].count("/") == 1:
        rest = rest[0].split("/")
    if len(rest) != 2 or not _NAME.match(rest[1]):
        return None
    kind = KINDS.get(rest[0].lower(), "")
    if kind not in (("workloads", "nodes") if verb == "describe" else ("workloads",)):
        return None
    if verb == "describe" and ("wait" in opts or "timeout" in opts or opts.get("output", "text") != "text"):
        return None  # json, yaml; options describe does not have: the full client
    if verb == "delete" and "output" in opts:
        return None
    timeout = opts.get("timeout", "60")
    if not _SECONDS.match(timeout):
        return None
    return VerbCommand(verb=verb, kind=kind, name=rest[1], wait=opts.get("wait", "yes") == "yes",
                       timeout=float(timeout), server=opts.get("server"), context=opts.get("context"),
                       token=opts.get("token") or os.environ.get("PERSYS_TOKEN") or None)


# --------------------------------------------------------------------------- printing


_EMOJI = re.compile(r":\S*?:")  # what rich's emoji replacement may act on (rich/_emoji_replace.py)


def as_rich_prints(text: str) -> str:
    """`text` as the full client's console prints it with markup and highlighting off: rich
    still replaces emoji codes (`:smile:`). Only such a line loads rich's table of codes."""
    if not _EMOJI.search(text):
        return text
    try:
        from rich._emoji_replace import _emoji_replace
    except ImportError:  # a rich that moved it: the full client prints this one
        raise FullClient from None
    return str(_emoji_replace(text))


def describe_lines(cmd: VerbCommand, item: dict[str, object], events: list[dict[str, object]]) -> str:
    """What `persysctl describe KIND NAME` prints for an object and its latest events. Pure."""
    from typing import Any, cast

    from persys.cli.output.describe_text import node_text, workload_text
    from persys.cli.output.listing_rows import age_text
    from persys.cli.output.safe_text import printable

    doc = cast(dict[str, Any], item)
    text = workload_text(doc) if cmd.kind == "workloads" else node_text(doc)
    lines = [as_rich_prints(printable(text, keep_newlines=True))]
    if events:
        lines.append("Events:")
        for e in cast(list[dict[str, Any]], events):
            lines.append(as_rich_prints(printable(f"  {age_text(e['ts']):>5} ago  {e['kind']:<18} {e['message']}")))
    return "".join(line + "\n" for line in lines)


# --------------------------------------------------------------------------- the commands


def describe(gw: Gateway, cmd: VerbCommand) -> None:
    item = gw.request("GET", f"/v1/{cmd.kind}/{cmd.name}")
    describe_lines(cmd, item, [])  # FullClient here, before any byte, if rich must print it
    try:
        events = gw.request("GET", "/v1/events", {"limit": "10", "subject": f"{cmd.kind[:-1]}/{cmd.name}"})
    except QuickError:  # the full client has printed the object before it asks for its events
        sys.stdout.write(describe_lines(cmd, item, []))
        sys.stdout.flush()
        raise
    sys.stdout.write(describe_lines(cmd, item, events))
    sys.stdout.flush()


def delete(gw: Gateway, cmd: VerbCommand) -> None:
    ref = f"workload/{cmd.name}"
    r = gw.request("DELETE", f"/v1/workloads/{cmd.name}")
    if r["alreadyGone"]:
        sys.stdout.write(f"{ref} already gone\n")
        return
    if not cmd.wait:
        sys.stdout.write(f"{ref} deletion requested\n")
        return
    status = _Status(f"deleting {ref} ...")
    deadline = time.monotonic() + cmd.timeout
    pause = POLL_FIRST
    try:
        while time.monotonic() < deadline:
            try:
                gw.request("GET", f"/v1/workloads/{cmd.name}")
            except QuickError:  # gone (404), or no answer at all: as the full client, which stops on any error
                break
            time.sleep(pause)
            pause = min(POLL_MAX, pause * 2)
        else:
            raise QuickError(f"{ref} is still being deleted after {cmd.timeout:.0f}s "
                             f"(see `persysctl describe workload {cmd.name}`)")
    finally:
        status.clear()
    sys.stdout.write(f"{ref} deleted\n")


class _Status:
    """The full client shows a transient spinner line on a terminal's stderr while it waits
    (rich's status) and nothing on a pipe; this is the same line without the spinner, erased at
    the end, so what stays on the screen is the same."""

    def __init__(self, text: str) -> None:
        self.shown = sys.stderr.isatty()
        if self.shown:
            sys.stderr.write(f"\r{text}")
            sys.stderr.flush()

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()


def run(argv: list[str]) -> bool:
    """Answer a describe or a delete here; False when the full client must (nothing was printed
    then, and only reads were sent)."""
    cmd = parse(argv)
    if cmd is None:
        return False
    try:
        gw = Gateway(cmd)
        if cmd.verb == "describe":
            describe(gw, cmd)
        else:
            delete(gw, cmd)
    except FullClient:
        return False
    except QuickError as e:
        fail(str(e))
    return True
