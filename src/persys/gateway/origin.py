"""Cross-site WebSocket hijacking (issue #30, 8): a browser holding a client certificate sends it
to the gateway on a WebSocket any page opens, and WebSockets are not bound by the same-origin
policy; the page would then type into a terminal as the user. Browsers always send `Origin` on a
WebSocket handshake: a terminal is opened only when it names the gateway itself (its scheme and
the Host the client asked for). No Origin at all is a non-browser client (persysctl, websocat),
which carries no ambient credential a page could borrow: allowed."""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


def _authority(scheme: str, host: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(f"{scheme}://{host}")
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname.lower().rstrip("."), port


def origin_refusal(origin: str | None, host: str | None, secure: bool) -> str:
    """Why a WebSocket handshake with this `Origin` header may not open a terminal ("" when it
    may); `host` is the request's Host header, `secure` whether it came over TLS."""
    if origin is None:
        return ""
    scheme = "https" if secure else "http"
    if not host:
        return "Origin: a browser's WebSocket without a Host header is refused"
    try:
        o = urlsplit(origin.strip())
    except ValueError:
        return f"Origin: {origin[:100]!r} is not an origin; cross-site WebSockets are refused"
    theirs = _authority(o.scheme, o.netloc) if o.scheme in DEFAULT_PORTS else None
    if o.scheme != scheme or theirs is None or theirs != _authority(scheme, host):
        return (f"Origin: {origin[:100]!r} is not this gateway ({scheme}://{host[:100]}); a terminal is opened "
                "from the gateway's own pages or a non-browser client only (cross-site WebSocket refused)")
    return ""
