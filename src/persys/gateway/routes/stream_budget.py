"""How many long-lived streams (followed logs, terminals) each caller may hold at one gateway, and
the gateway in all: a bound on what one user can tie up."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

from persys.security import forwarding


class StreamBudget:
    def __init__(self, per_caller: int, total: int, verb: str, noun: str) -> None:
        self.per_caller, self.total = per_caller, total
        self.verb, self.noun = verb, noun  # for the refusal: "you already follow 8 logs"
        self.held: Counter[str] = Counter()

    def refusal(self, who: str) -> str:
        """Why `who` may not open one more ("" when it may)."""
        if sum(self.held.values()) >= self.total:
            return f"this gateway holds {self.total} {self.noun} already; retry later"
        if self.held[who] >= self.per_caller:
            return (f"you already {self.verb} {self.per_caller} {self.noun} through this gateway (at most); "
                    "close one first")
        return ""

    @contextlib.contextmanager
    def slot(self, who: str) -> Iterator[None]:
        self.held[who] += 1
        try:
            yield
        finally:
            self.held[who] -= 1
            if not self.held[who]:
                del self.held[who]


def caller_key() -> str:
    """Who is asking, as the authorization middleware forwards it (principal or token)."""
    md = dict(forwarding.current())
    return md.get(forwarding.ON_BEHALF_OF) or md.get(forwarding.AUTHORIZATION) or "(anonymous)"
