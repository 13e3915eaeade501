"""The caller a gateway forwards to the scheduler, as gRPC call metadata.

The gateway authenticates a REST caller (client certificate or bearer token) and calls the
scheduler on its behalf: a certificate identity travels as `persys-on-behalf-of` (principal)
and `persys-on-behalf-of-groups`, a token as the `authorization` metadata itself (so the
scheduler checks the token, not the gateway's word). The scheduler believes the first two only
from a gateway identity. The metadata of the request being served lives in a context variable,
so the scheduler client adds it to each call without every call site passing it.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from urllib.parse import quote, unquote

from persys.security.identity import Identity

ON_BEHALF_OF = "persys-on-behalf-of"
ON_BEHALF_OF_GROUPS = "persys-on-behalf-of-groups"
REQUEST_ID = "persys-request-id"
AUTHORIZATION = "authorization"

Metadata = tuple[tuple[str, str], ...]
_current: ContextVar[Metadata] = ContextVar("persys_forwarded", default=())


def metadata_for(identity: Identity | None, token: str | None, request_id: str) -> Metadata:
    md: list[tuple[str, str]] = [(REQUEST_ID, quote(request_id, safe=""))]
    if token:
        md.append((AUTHORIZATION, f"Bearer {token}"))
    elif identity is not None:
        # Quoted: metadata values are printable ASCII, a subject's groups need not be.
        md.append((ON_BEHALF_OF, quote(identity.principal, safe=":")))
        md.append((ON_BEHALF_OF_GROUPS, ",".join(quote(g, safe=":") for g in identity.groups)))
    return tuple(md)


def groups_from(value: str) -> tuple[str, ...]:
    return tuple(unquote(g) for g in value.split(",") if g)


def principal_from(value: str) -> str:
    return unquote(value)


def forward(md: Metadata) -> Token[Metadata]:
    return _current.set(md)


def reset(token: Token[Metadata]) -> None:
    _current.reset(token)


def current() -> Metadata:
    """The metadata to send with a scheduler call made while serving the current request."""
    return _current.get()
