"""persysctl's quick path for `apply -f FILE` of workload manifests (#33, item 7): the same
requests and the same bytes as the full client (`cli.ctl.app`'s `apply`), without loading the
pydantic models, typer or rich.

The full client validates every document locally before it sends anything; loading the models
alone costs more than a quick command's whole budget. Here the gateway validates instead — it
runs the same models, and it refuses a single manifest or a whole batch before writing anything.
So a refusal for the document's content (400, 413, 422: nothing was written) hands the command
line to the full client unchanged, which validates locally and prints its usual message; the
extra round trip is paid only by a manifest that is wrong. Any other refusal (401, 403, 409, 503
...) or a transport error prints the full client's line, as the other quick paths do.

Answered here: `apply -f FILE` (or `--filename`, `-fFILE`, `--filename=FILE`) with one regular
file of at most APPLY_BATCH documents, each a plain workload manifest (`apiVersion`, `kind:
Workload`, `metadata`, `spec` and nothing else), and the global options. Anything else — several
files, a folder, stdin, other kinds (Secret, Volume, Bucket, Policy: applied first by the full
client), a `get -o yaml` view, --dry-run, --wait, -o, -v — is the full client's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from persys.cli.quick.gateway import GLOBAL, FullClient, Gateway, QuickError, Refused, fail, option_value
from persys.cli.records import record

APPLY_BATCH = 500  # as cli.ctl.app.APPLY_BATCH: the full client splits larger sets into several requests
MANIFEST_KEYS = frozenset({"apiVersion", "kind", "metadata", "spec"})
CONTENT_REFUSALS = (400, 413, 422)  # the gateway wrote nothing; the full client says what is wrong


@record
class ApplyCommand:
    path: Path
    server: str | None = None
    context: str | None = None
    token: str | None = None


def parse(argv: list[str]) -> ApplyCommand | None:
    """The `apply -f FILE` this path answers, or None for the full client. Pure."""
    opts: dict[str, str] = {}
    files: list[str] = []
    seen_apply = False
    i = 0
    while i < len(argv):
        a = argv[i]
        key, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
        if a.startswith("-f") and len(a) > 2 and seen_apply:
            files.append(a[2:])
        elif key in ("-f", "--filename", *GLOBAL):
            i, given = option_value(argv, i, eq, value)
            if given is None:
                return None
            value = given
            if key in ("-f", "--filename"):
                if not seen_apply:
                    return None
                files.append(value)
            elif (key in ("--token", "--context")) == seen_apply:
                return None  # --token/--context go before the command, --server anywhere else: misplaced
            else:
                opts[key[2:]] = value
        elif a == "apply" and not seen_apply:
            seen_apply = True
        else:
            return None  # another command, an option of apply's this path leaves alone, a stray word
        i += 1
    if not seen_apply or len(files) != 1 or files[0] == "-":
        return None
    return ApplyCommand(path=Path(files[0]), server=opts.get("server"), context=opts.get("context"),
                        token=opts.get("token") or os.environ.get("PERSYS_TOKEN") or None)


def plain_manifests(docs: list[Any]) -> list[dict[str, Any]] | None:
    """The documents when every one is a plain workload manifest; None otherwise. Pure."""
    out: list[dict[str, Any]] = []
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "Workload" or "apiVersion" not in doc:
            return None
        if not set(doc) <= MANIFEST_KEYS or not isinstance(doc.get("metadata"), dict):
            return None
        name = doc["metadata"].get("name")
        if not isinstance(name, str) or not name.isascii() or not name.isprintable():
            return None
        out.append(doc)
    return out if 0 < len(out) <= APPLY_BATCH else None


def result_lines(results: list[dict[str, Any]]) -> str:
    """What the full client prints for the gateway's answers. Pure."""
    def verb(r: dict[str, Any]) -> str:
        return "created" if r["created"] else "configured" if r["changed"] else "unchanged"

    return "".join(f"workload/{r['id']} {verb(r)}\n" for r in results)


def _fits(docs: list[dict[str, Any]]) -> bool:
    """rich wraps a line longer than the terminal; the full client prints such a line."""
    if not sys.stdout.isatty():
        return True
    try:
        width = os.get_terminal_size(sys.stdout.fileno()).columns
    except OSError:
        return False
    env = os.environ.get("COLUMNS", "")
    width = min(width, int(env)) if env.isdigit() else width
    return all(len(f"workload/{d['metadata']['name']} configured") <= width for d in docs)


def _read(cmd: ApplyCommand) -> list[dict[str, Any]]:
    from persys.model.documents import DocumentError, load_yaml_all
    from persys.model.limits import BATCH_MAX_BYTES, MANIFEST_MAX_BYTES

    try:
        if not cmd.path.is_file() or cmd.path.stat().st_size > BATCH_MAX_BYTES // 2:
            raise FullClient  # no such file, a folder, too large for one request: the full client says or splits
        docs = [d for d in load_yaml_all(cmd.path.read_text()) if d is not None]
    except (OSError, UnicodeDecodeError, DocumentError):
        raise FullClient from None
    manifests = plain_manifests(docs)
    if manifests is None or not _fits(manifests):
        raise FullClient
    if any(len(json.dumps(d)) > MANIFEST_MAX_BYTES for d in manifests):
        raise FullClient
    return manifests


def apply(gw: Gateway, docs: list[dict[str, Any]]) -> None:
    try:
        if len(docs) > 1:
            results = gw.request("POST", "/v1/workloads:batch", body=docs, refused=CONTENT_REFUSALS)["items"]
        else:
            results = [gw.request("POST", "/v1/workloads", {"dryRun": "false"}, body=docs[0],
                                  refused=CONTENT_REFUSALS)]
    except Refused:
        raise FullClient from None
    sys.stdout.write(result_lines(results))
    sys.stdout.flush()



def run(argv: list[str]) -> bool:
    """Answer an `apply -f FILE` here; False when the full client must (nothing was printed or
    written then)."""
    cmd = parse(argv)
    if cmd is None:
        return False
    try:
        docs = _read(cmd)
        apply(Gateway(cmd), docs)
    except FullClient:
        return False
    except QuickError as e:
        fail(str(e))
    return True
