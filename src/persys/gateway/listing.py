"""Lists over REST: a page with its continue token, or (for clients from before pages) the whole
list streamed a page at a time, so neither the gateway nor the scheduler holds it at once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from persys.client import SchedulerClient


async def list_response(client: SchedulerClient, kind: str, node: str, limit: int | None, token: str | None
                        ) -> Response:
    if limit is not None or token is not None:
        items, nxt = await client.list_page(kind, node, limit or 0, token or "")
        return JSONResponse({"items": items, "continue": nxt})
    # The first page is fetched before answering, so a refusal still becomes an HTTP error.
    first, nxt = await client.list_page(kind, node)
    return StreamingResponse(_json_list(client, kind, node, first, nxt), media_type="application/json")


async def _json_list(client: SchedulerClient, kind: str, node: str, items: list[dict[str, Any]], token: str
                     ) -> AsyncIterator[bytes]:
    started = False
    while True:
        if items:
            yield (b"," if started else b"[") + b",".join(json.dumps(i).encode() for i in items)
            started = True
        if not token:
            break
        items, token = await client.list_page(kind, node, token=token)
    yield b"]" if started else b"[]"
