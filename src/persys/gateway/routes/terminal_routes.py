"""Interactive terminals over WebSocket: `persysctl console` (a VM's or microVM's serial console) and
`persysctl exec -t` (a command on a TTY in a container, a compose service or a process workload),
relayed to the node's agent (AgentService.Attach) over mutual TLS.

The protocol on the socket: binary frames are the terminal's bytes both ways; text frames are JSON
control messages. From the gateway: `{"ready": true, instance, node, runtime, target}` first, then
output, then `{"ended": true, "exitCode", "detail"}` or `{"error": ...}` before it closes. From the
client: `{"cols": C, "rows": R}` when its window changes. Refusals come before the handshake
completes, as the same JSON answers as any route (400 naming the parameter, 403, 404, 409, 429).
Each path also answers a plain GET (426: upgrade needed), which is what the OpenAPI document
describes, with its parameters. Audited at the gateway as `exec workloads` (typing into a console
is exec's power): who, which workload, the command line; never what was typed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

import grpc
from fastapi import APIRouter, Query, WebSocket
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketDisconnect

from persys._pb.persys.v1 import agent_pb2 as apb
from persys.agent_client import attach
from persys.client import SchedulerClient, SchedulerError
from persys.gateway.authorization import AUDIT_DETAIL
from persys.gateway.origin import origin_refusal
from persys.gateway.routes.common import HTTP_STATUS, WorkloadId
from persys.gateway.routes.exec_routes import AGENT_STATUS, locate
from persys.gateway.routes.stream_budget import StreamBudget, caller_key
from persys.gateway.schemas import (
    AGENT_ERRORS,
    COMPOSE_SERVICE,
    INSTANCE_ID,
    SCHEDULER_ERRORS,
    WORKLOAD_ID,
    TerminalQuery,
)
from persys.tlsfiles import TLSFiles

TERMINAL_FRAME_MAX_BYTES = 1 << 20  # one WebSocket message from a client, at most (a paste)
TERMINAL_CHUNK = 64 * 1024  # the agent takes input in pieces of at most this
TERMINALS_PER_CALLER = 8
TERMINALS_TOTAL = 128
_CONTROL_MAX = 1024  # a text (control) frame's characters
_UPGRADE: dict[int | str, dict[str, Any]] = {
    426: {"description": "This is a WebSocket endpoint: connect with `Upgrade: websocket` (persysctl console / "
                         "exec -t do)"},
    429: {"description": "The caller already holds as many terminals as allowed (close one)"}}


def _error(message: str, status: int, problems: list[str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "problems": problems or []}, status_code=status)


def _query(params: Mapping[str, Any], multi: list[tuple[str, str]], *, exec_: bool) -> TerminalQuery | JSONResponse:
    """The URL's parameters checked (a 400 naming each bad one), as the body of a POST would be."""
    unknown = sorted({k for k, _ in multi} - set(TerminalQuery.model_fields) - ({"command"} if exec_ else set()))
    if unknown or (not exec_ and "command" in params):
        bad = unknown or ["command"]
        return _error(f"unknown parameter {bad[0]!r}", 400, [f"{b}: not a parameter here" for b in bad])
    raw: dict[str, Any] = {k: v for k, v in params.items() if k != "command"}
    raw["command"] = [v for k, v in multi if k == "command"]  # cols and rows: pydantic reads "80" as 80
    try:
        q = TerminalQuery.model_validate(raw)
    except ValidationError as err:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
        return _error(f"bad parameters: {problems[0]}", 400, problems)
    if exec_ and (not q.command or not q.command[0]):
        return _error("command: the command to run is required (?command=sh&command=-l)", 400,
                      ["command: required"])
    return q


def _note(conn: HTTPConnection, **detail: Any) -> None:
    setattr(conn.state, AUDIT_DETAIL, {k: str(v)[:1000] for k, v in detail.items()})


async def _to_agent(ws: WebSocket, call: Any) -> None:
    """The client's keystrokes and window sizes to the agent, until the client leaves."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("bytes")
        if data:
            for at in range(0, len(data), TERMINAL_CHUNK):
                await call.write(apb.TerminalInput(data=data[at:at + TERMINAL_CHUNK]))
            continue
        text = message.get("text") or ""
        try:
            size: Any = json.loads(text) if len(text) <= _CONTROL_MAX else {}
            cols, rows = int(size["cols"]), int(size["rows"])
        except (ValueError, TypeError, KeyError):
            continue  # not a control message this gateway knows: ignored, as unknown fields are
        if 0 < cols <= 1000 and 0 < rows <= 1000:
            await call.write(apb.TerminalInput(cols=cols, rows=rows))


async def _to_client(ws: WebSocket, call: Any, node: str) -> None:
    """The terminal's output to the client, then how it ended."""
    try:
        while (out := await call.read()) is not grpc.aio.EOF:
            if out.ended:
                await ws.send_json({"ended": True, "exitCode": out.exit_code, "detail": out.detail})
                return
            await ws.send_bytes(out.data)
        await ws.send_json({"error": f"agent on {node}: the terminal ended without saying how"})
    except grpc.aio.AioRpcError as err:  # the agent or the link went away mid-session
        await ws.send_json({"error": f"agent on {node}: {err.details()}"})


async def _relay(ws: WebSocket, call: Any, node: str) -> None:
    """Both directions until either ends; then the other is stopped."""
    tasks = {asyncio.create_task(_to_agent(ws, call)), asyncio.create_task(_to_client(ws, call, node))}
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, grpc.aio.AioRpcError):
                t.result()  # a client gone mid-send is the end too, not an error
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Terminals:
    def __init__(self, client: SchedulerClient, agent_tls: TLSFiles | None) -> None:
        self.client = client
        self.agent_tls = agent_tls
        self.budget = StreamBudget(TERMINALS_PER_CALLER, TERMINALS_TOTAL, "hold", "terminals")

    async def serve(self, ws: WebSocket, workload_id: str, what: str) -> None:
        cross_site = origin_refusal(ws.headers.get("origin"), ws.headers.get("host"), ws.url.scheme == "wss")
        if cross_site:
            await ws.send_denial_response(_error(cross_site, 403, ["Origin: not this gateway"]))
            return
        if not re.match(WORKLOAD_ID, workload_id):
            await ws.send_denial_response(_error(f"workload_id: {workload_id[:100]!r} is not a workload name", 400,
                                                 ["workload_id: not a workload name"]))
            return
        q = _query(ws.query_params, ws.query_params.multi_items(), exec_=what == "exec")
        if isinstance(q, JSONResponse):
            await ws.send_denial_response(q)
            return
        shown = {"command": shlex.join(q.command)} if q.command else {}
        _note(ws, workload=workload_id, terminal=what, instance=q.instance, service=q.service, **shown)
        try:
            where = await locate(self.client, self.agent_tls, workload_id, q.instance, what)
        except SchedulerError as err:
            await ws.send_denial_response(_error(err.message, HTTP_STATUS.get(err.code, 502)))
            return
        if isinstance(where, JSONResponse):
            await ws.send_denial_response(where)
            return
        inst, node, address = where
        who = caller_key()
        refusal = self.budget.refusal(who)
        if refusal:
            await ws.send_denial_response(_error(refusal, 429))
            return
        _note(ws, workload=workload_id, terminal=what, instance=inst, node=node, service=q.service, **shown)
        assert self.agent_tls is not None
        opening = apb.TerminalInput(instance_id=inst, what=what, command=q.command, service=q.service,
                                    cols=q.cols, rows=q.rows)
        with self.budget.slot(who):
            async with attach(address, self.agent_tls, opening, node_id=node) as call:
                try:
                    first = await call.read()
                except grpc.aio.AioRpcError as err:
                    await ws.send_denial_response(_error(f"agent on {node}: {err.details()}",
                                                         AGENT_STATUS.get(err.code(), 502)))
                    return
                if first is grpc.aio.EOF or not first.ready:
                    await ws.send_denial_response(_error(f"agent on {node}: the terminal did not open", 502))
                    return
                await ws.accept()
                await ws.send_json({"ready": True, "instance": inst, "node": node, "runtime": first.runtime,
                                    "target": first.target})
                await _relay(ws, call, node)
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await ws.close(1000)


def terminal_routes(client: SchedulerClient, agent_tls: TLSFiles | None) -> APIRouter:
    router = APIRouter()
    terminals = _Terminals(client, agent_tls)
    instance_q = Query("", pattern=f"^$|{INSTANCE_ID}", description="empty: the first instance")
    size_q = Query(0, ge=0, le=1000, description="the client's window size (0: unknown)")
    command_q = Query(..., min_length=1, max_length=256, description="argv, one parameter per word, run as is")
    service_q = Query("", pattern=COMPOSE_SERVICE, description="compose: the service whose container runs it")

    @router.get("/v1/workloads/{workload_id}/console", tags=["workloads"], status_code=426,
                responses={**SCHEDULER_ERRORS, **AGENT_ERRORS, **_UPGRADE})
    async def console_doc(workload_id: str = WorkloadId, instance: str = instance_q) -> JSONResponse:
        """A VM's or microVM's serial console, interactive, over a **WebSocket** on this path
        (`persysctl console`): binary frames are the console's bytes both ways; text frames are JSON:
        `{"ready": ...}` first, `{"ended": ...}` or `{"error": ...}` last. One client at a time;
        detaching leaves the VM running. A plain GET answers 426."""
        return _error(f"/v1/workloads/{workload_id}/console is a WebSocket endpoint: connect with "
                      "`Upgrade: websocket` (persysctl console does)", 426)

    @router.get("/v1/workloads/{workload_id}/terminal", tags=["workloads"], status_code=426,
                responses={**SCHEDULER_ERRORS, **AGENT_ERRORS, **_UPGRADE})
    async def terminal_doc(workload_id: str = WorkloadId, instance: str = instance_q,
                           command: list[str] = command_q, service: str = service_q, cols: int = size_q,
                           rows: int = size_q) -> JSONResponse:
        """A command on a TTY in a running instance (`persysctl exec -t`: a container, a compose
        service's container, a process workload's environment) over a **WebSocket** on this path:
        binary frames are the terminal's bytes both ways; text frames are JSON: `{"cols", "rows"}`
        from the client when its window changes; `{"ready": ...}` first and `{"ended": true,
        "exitCode": N}` last from the gateway. Leaving kills the command. A plain GET answers 426."""
        return _error(f"/v1/workloads/{workload_id}/terminal is a WebSocket endpoint: connect with "
                      "`Upgrade: websocket` (persysctl exec -t does)", 426)

    @router.websocket("/v1/workloads/{workload_id}/console")
    async def console(ws: WebSocket, workload_id: str) -> None:
        await terminals.serve(ws, workload_id, "console")

    @router.websocket("/v1/workloads/{workload_id}/terminal")
    async def terminal(ws: WebSocket, workload_id: str) -> None:
        await terminals.serve(ws, workload_id, "exec")

    return router
