"""HTML built in Python: every value escaped unless it is already `Html` (markup this package
made). No template engine: pages are small functions over data, type-checked like the rest,
and nothing user-supplied (a workload name, a label, an event message) can become markup."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable


class Html(str):
    """Markup already escaped (or written here)."""

    __slots__ = ()

    def __add__(self, other: str) -> Html:
        return Html(str.__add__(self, esc(other)))


def esc(value: object) -> Html:
    return value if isinstance(value, Html) else Html(html.escape(str(value), quote=True))


def join(parts: Iterable[object], sep: str = "") -> Html:
    return Html(sep.join(esc(p) for p in parts))


def tag(name: str, /, *children: object, **attrs: object) -> Html:
    """<name attrs>children</name>; `class_` is `class`, `data_x` is `data-x`; None and False
    attributes are left out, True ones are bare."""
    parts = [name]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        attr = key.rstrip("_").replace("_", "-")
        parts.append(attr if value is True else f'{attr}="{esc(value)}"')
    opening = "<" + " ".join(parts) + ">"
    if name in ("input", "br", "meta", "link", "hr"):
        return Html(opening)
    return Html(opening + join(children) + f"</{name}>")


def table(headers: Iterable[str], rows: Iterable[Iterable[object]], empty: str = "None.", **attrs: object) -> Html:
    body = [tag("tr", *(tag("td", c) for c in row)) for row in rows]
    if not body:
        return tag("p", empty, class_="muted")
    return tag("div", tag("table", tag("thead", tag("tr", *(tag("th", h, scope="col") for h in headers))),
                          tag("tbody", *body), **attrs), class_="scroll")


def link(href: str, text: object) -> Html:
    return tag("a", text, href=href)


def badge(text: str) -> Html:
    return tag("span", text, class_=f"badge b-{text.lower()}")


def ago(ts: float, now: float | None = None) -> str:
    if not ts:
        return "-"
    s = max(0.0, (now or time.time()) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit} ago"
    return f"{int(s)}s ago"


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) if ts else "-"


def mib(n: float) -> str:
    return f"{n / 1024:.1f} GiB" if n >= 1024 else f"{int(n)} MiB"
