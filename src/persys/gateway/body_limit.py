"""Request-body size limits enforced before anything is parsed (an ASGI middleware).

A body whose Content-Length is over its route's limit is refused with 413 at once, without
reading it (a client that sent `Expect: 100-continue` never sends it). A chunked body is
counted as it streams: the read that crosses the limit raises `BodyTooLarge`, so at most the
limit plus one chunk is ever held.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from persys.model.limits import human_bytes


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int, path: str) -> None:
        self.limit = limit
        super().__init__(413, f"request body exceeds the limit of {human_bytes(limit)} ({limit} bytes) for {path}")

    def body(self) -> dict[str, object]:
        return {"error": self.detail, "limit": self.limit, "problems": []}


class BodyLimit:
    def __init__(self, app: ASGIApp, limit_for: Callable[[str, str], int]) -> None:
        self.app = app
        self.limit_for = limit_for  # (method, path) -> bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        limit = self.limit_for(scope["method"], path)
        if await _refused_by_length(scope, receive, send, limit):
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit, path)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge as err:  # raised where no exception handler saw it
            if started:
                raise
            await _reply(send, 413, err.body())


async def _refused_by_length(scope: Scope, receive: Receive, send: Send, limit: int) -> bool:
    """Whether the announced Content-Length is refused (400 not a number, 413 too large: the
    answer sent before the application sees the request)."""
    length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    if length is None:
        return False
    if not length.isdigit():
        await _reply(send, 400, {"error": "Content-Length is not a number", "problems": []})
        return True
    if int(length) <= limit:
        return False
    expects = any(k == b"expect" and v.lower() == b"100-continue" for k, v in scope["headers"])
    if int(length) <= LINGER_MAX_BYTES and not expects:  # (100-continue: no body comes)
        await _discard(receive)  # so the client, still sending, reads the answer
    await _reply(send, 413, BodyTooLarge(limit, scope["path"]).body())
    return True


async def _reply(send: Send, status: int, doc: dict[str, object]) -> None:
    body = json.dumps(doc).encode()
    # Connection: close, since the rest of the body is never read.
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


# A body announced too large, up to this size, is read and dropped before the 413: answering at
# once and closing while the client still sends makes it see a broken connection (an EOF in TLS)
# instead of the answer (the schema fuzzer met it on a busy machine). Larger ones are cut at once.
LINGER_MAX_BYTES = 16 * 1024 * 1024


async def _discard(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
