"""Lists a page at a time.

A page is the next ids in sorted order after a position (the last id the previous page held),
so a list walked while workloads come and go returns every item that existed throughout
exactly once: a token is a position, never an offset. Views are rendered only for the ids a
page holds, and a page also stops at a byte budget, so one list call costs the page, not the
cluster. The ids stay sorted as the mirror changes (`SortedIds`), so finding a position is a
binary search, not a sort of every id per call.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

DEFAULT_PAGE = 500  # items per page when the caller does not say
MAX_PAGE = 5_000  # a larger `limit` is lowered to this
MAX_PAGE_BYTES = 1 << 20  # a page ends here (it always holds at least one item)
TOKEN_MAX_CHARS = 1_024  # longer is not a token we issued
MAX_EVENTS = 10_000  # events are listed newest first, one answer of at most this many (the gateway's bound)


class BadPageRequest(ValueError):
    """A `limit` or `continue` the API cannot use; the message names the field."""


@dataclass(frozen=True, slots=True)
class Position:
    after: str  # resume after this id ("" = from the start)
    revision: int  # mirror revision when the walk began (informative: positions stay valid)


def encode_token(after: str, revision: int) -> str:
    raw = json.dumps([after, revision], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> Position:
    if not token:
        return Position("", 0)
    if len(token) > TOKEN_MAX_CHARS:
        raise BadPageRequest(f"continue: longer than {TOKEN_MAX_CHARS} characters; pass the token a page returned")
    try:
        doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        raise BadPageRequest("continue: not a token this API returned") from None
    if (not isinstance(doc, list) or len(doc) != 2 or not isinstance(doc[0], str)
            or not isinstance(doc[1], int) or isinstance(doc[1], bool)):
        raise BadPageRequest("continue: not a token this API returned")
    return Position(doc[0], doc[1])


def page_limit(requested: int) -> int:
    """Items per page: 0 means the default; more than MAX_PAGE is lowered to it."""
    if requested < 0:
        raise BadPageRequest(f"limit: must be 0 (default {DEFAULT_PAGE}) or positive, got {requested}")
    return min(requested or DEFAULT_PAGE, MAX_PAGE)


@dataclass(frozen=True, slots=True)
class Page:
    items: list[bytes]
    next_after: str | None  # None: this was the last page


def take_page(ids: Iterator[str], render: Callable[[str], bytes | None], limit: int,
              max_bytes: int = MAX_PAGE_BYTES) -> Page:
    """Render ids in order until `limit` items or `max_bytes` (`render` returns None to skip
    an id: filtered out, or gone meanwhile). The next page resumes after the last item."""
    items: list[bytes] = []
    size = 0
    last = ""
    for ident in ids:
        if len(items) >= limit or (items and size >= max_bytes):
            return Page(items, last)
        doc = render(ident)
        if doc is None:
            continue
        items.append(doc)
        size += len(doc)
        last = ident
    return Page(items, None)


class SortedIds:
    """The keys of a mirror dictionary, kept sorted as they come and go.

    Fed by the mirror's change notifications (`on_change`, subscribed to `ClusterState`); a
    reset, or a size that no longer matches (a bulk load notifies nobody), rebuilds it once."""

    def __init__(self, kind: str, source: Mapping[str, object]) -> None:
        self.kind = kind
        self._source = source
        self._ids: list[str] = []
        self._stale = True

    def on_change(self, kind: str, ident: str) -> None:
        if kind == "reset":
            self._stale = True
        if kind != self.kind or self._stale:
            return
        i = bisect.bisect_left(self._ids, ident)
        held = i < len(self._ids) and self._ids[i] == ident
        if ident in self._source and not held:
            self._ids.insert(i, ident)
        elif ident not in self._source and held:
            del self._ids[i]

    def after(self, position: str) -> Iterator[str]:
        """Ids greater than `position`, in order (read it before the mirror changes again)."""
        if self._stale or len(self._ids) != len(self._source):
            self._ids = sorted(self._source)
            self._stale = False
        start = bisect.bisect_right(self._ids, position)
        return (self._ids[i] for i in range(start, len(self._ids)))
