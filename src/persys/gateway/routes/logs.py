"""`GET /v1/workloads/{id}/logs`: an instance's output, fetched from its node's agent over mutual TLS.

Without `follow` the answer is JSON (the text at once). With `follow=true` it is Server-Sent
Events relayed from the agent's StreamLogs, as the other streams (routes/streams.py): a `data:`
frame per piece of output (`{"text": ...}`), a `: keep-alive` comment after KEEPALIVE_SECONDS of
silence, then `event: end` when the instance goes away (or `event: error`). Refusals come before
the first frame as ordinary answers (400 naming the parameter, 404, 409, 429). Memory is bounded:
one piece is in flight at a time, and a client that reads slowly slows the agent through gRPC
flow control; a client that leaves cancels the agent's stream at once. Each caller may follow
at most STREAMS_PER_CALLER logs through one gateway, the gateway STREAMS_TOTAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse

from persys._pb.persys.v1 import agent_pb2 as apb
from persys.agent_client import fetch_logs, stream_logs
from persys.client import SchedulerClient
from persys.events.filters import FilterError, parse_since
from persys.gateway.routes.common import WorkloadId
from persys.gateway.routes.stream_budget import StreamBudget, caller_key
from persys.gateway.routes.streams import KEEPALIVE_SECONDS, SSE_HEADERS
from persys.gateway.schemas import AGENT_ERRORS, INSTANCE_ID, SCHEDULER_ERRORS
from persys.tlsfiles import TLSFiles

STREAMS_PER_CALLER = 8
STREAMS_TOTAL = 256
LOG_ANSWERS: dict[int | str, dict[str, Any]] = {
    **SCHEDULER_ERRORS, **AGENT_ERRORS,
    200: {"description": "The output: JSON {instance, node, text}; with follow=true a stream of Server-Sent "
                         "Events (`data: {\"text\": ...}` per piece, `event: end` when the instance goes away)",
          "content": {"application/json": {"schema": {"type": "object"}},
                      "text/event-stream": {"schema": {"type": "string"}}}},
    429: {"description": "The caller already follows as many logs as allowed (close one)"},
}


def _error(message: str, status_code: int) -> JSONResponse:
    return JSONResponse({"error": message, "problems": []}, status_code=status_code)


@dataclass(frozen=True)
class _Target:
    instance: str
    node: str
    address: str


async def _target(client: SchedulerClient, agent_tls: TLSFiles | None, workload_id: str, instance: str
                  ) -> _Target | JSONResponse:
    """Where the instance runs, or the answer saying why its logs cannot be read."""
    return await instance_target(client, agent_tls, await client.get_workload(workload_id), workload_id, instance,
                                 "logs")


async def instance_target(client: SchedulerClient, agent_tls: TLSFiles | None, view: dict[str, Any],
                          workload_id: str, instance: str, what: str) -> _Target | JSONResponse:
    """Where the instance of a workload `view` runs (the first without `instance`), or the answer
    saying why `what` (logs, exec, cp) cannot reach it: shared by the routes that dial agents."""
    if not instance and not view["instances"]:
        return _error(f"{workload_id} has no instances", 404)
    inst = instance or view["instances"][0]["instance"]
    match = [i for i in view["instances"] if i["instance"] == inst]
    if not match:
        return _error(f"{workload_id} has no instance {inst}", 404)
    node_id = match[0]["node"]
    if not node_id:
        return _error(f"{inst} is not placed on any node ({match[0]['reason']})", 409)
    node = await client.get_node(node_id)
    if not node.get("address") or agent_tls is None:
        return _error(f"the agent on {node_id} serves no {what} endpoint", 501)
    return _Target(inst, node_id, node["address"])


def _agent_error(node_id: str, err: grpc.aio.AioRpcError) -> JSONResponse:
    codes = {grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.INVALID_ARGUMENT: 400}
    return _error(f"agent on {node_id}: {err.details()}", codes.get(err.code(), 502))


async def _with_keepalive(pieces: AsyncIterator[str], seconds: float) -> AsyncIterator[str | None]:
    """The pieces, and None after each `seconds` without one (time for a keep-alive)."""
    pending: asyncio.Task[str] | None = None
    try:
        while True:
            pending = pending or asyncio.ensure_future(anext(pieces))
            done, _ = await asyncio.wait({pending}, timeout=seconds)
            if not done:
                yield None
                continue
            piece, pending = pending.result(), None  # StopAsyncIteration ends this generator's loop
            yield piece
    except StopAsyncIteration:
        return
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, grpc.aio.AioRpcError):
                await pending


async def _follow(target: _Target, agent_tls: TLSFiles, request: apb.LogsRequest, budget: StreamBudget,
                  keepalive: float) -> Response:
    who = caller_key()
    refusal = budget.refusal(who)
    if refusal:
        return JSONResponse({"error": refusal, "code": "RESOURCE_EXHAUSTED"}, status_code=429)
    stream = stream_logs(target.address, agent_tls, request, node_id=target.node)
    try:
        await anext(stream)  # the agent accepted the request (its refusals are answers, not streams)
    except StopAsyncIteration:
        return _error(f"agent on {target.node}: the stream ended before it started", 502)
    except grpc.aio.AioRpcError as err:
        await stream.aclose()
        return _agent_error(target.node, err)

    async def frames() -> AsyncIterator[str]:
        with budget.slot(who):
            # No `retry:` (unlike the event streams): a reconnecting EventSource would repeat the tail.
            yield f": following {target.instance} on {target.node}\n\n"
            try:
                async for piece in _with_keepalive(stream, keepalive):
                    yield ": keep-alive\n\n" if piece is None else f"data: {json.dumps({'text': piece})}\n\n"
                yield f"event: end\ndata: {json.dumps({'reason': f'{target.instance} is gone from {target.node}'})}\n\n"
            except grpc.aio.AioRpcError as err:  # the agent or the link went away mid-stream
                yield f"event: error\ndata: {json.dumps({'error': f'agent on {target.node}: {err.details()}'})}\n\n"
            finally:  # the client left: end the agent's stream now, not when collected
                await stream.aclose()

    return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)


def log_routes(client: SchedulerClient, agent_tls: TLSFiles | None, keepalive: float = KEEPALIVE_SECONDS
               ) -> APIRouter:
    router = APIRouter()
    budget = StreamBudget(STREAMS_PER_CALLER, STREAMS_TOTAL, "follow", "logs")

    @router.get("/v1/workloads/{workload_id}/logs", tags=["workloads"], responses=LOG_ANSWERS,
                response_class=JSONResponse)
    async def logs(workload_id: str = WorkloadId,
                   instance: str = Query("", pattern=f"^$|{INSTANCE_ID}", description="empty: the first instance"),
                   tail: int = Query(100, ge=0, le=10_000, description="Lines of history first (0 with since: "
                                     "all since then)"),
                   since: str = Query("", max_length=64, description="10m, 2h, 1d or an RFC 3339 time: only "
                                      "output after it (container and compose workloads: the engine times "
                                      "each line; a process's output and a VM's console: when the agent "
                                      "saw it appear, within a second)"),
                   service: str = Query("", max_length=128, pattern="^$|^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                                        description="compose: only this service (without it each line is "
                                                    "prefixed by its service)"),
                   timestamps: bool = Query(False, description="Prefix each line with its RFC 3339 time"),
                   follow: bool = Query(False, description="Stream new output as Server-Sent Events until "
                                        "the instance goes away")) -> Response:
        """An instance's output (container logs, compose services, a VM's serial console, a process),
        fetched from its node's agent over mutual TLS; with follow=true, streamed as it is written."""
        try:
            since_at = parse_since(since, time.time()) if since else 0.0
        except FilterError as err:
            return JSONResponse({"error": str(err), "problems": [str(err)]}, status_code=400)
        target = await _target(client, agent_tls, workload_id, instance)
        if isinstance(target, JSONResponse):
            return target
        assert agent_tls is not None  # _target answered 501 otherwise
        request = apb.LogsRequest(instance_id=target.instance, tail=tail, since=since_at,
                                  service=service, timestamps=timestamps)
        if follow:
            return await _follow(target, agent_tls, request, budget, keepalive)
        try:
            text = await fetch_logs(target.address, agent_tls, request, node_id=target.node)
        except grpc.aio.AioRpcError as err:
            return _agent_error(target.node, err)
        return JSONResponse({"instance": target.instance, "node": target.node, "text": text})

    return router
