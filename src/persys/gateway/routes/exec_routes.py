"""Inside a workload: run a command (`persysctl exec`) and copy files in and out (`persysctl cp`),
done by the agent of the instance's node over mutual TLS.

The scheduler never sees these, so the gateway records them in the audit log itself (the rules are
`at_gateway`); each route adds what it did (the command line, the path; never env values) to the
record through the request's state.
"""

from __future__ import annotations

import asyncio
import base64
import shlex
from collections.abc import AsyncIterator
from typing import Any

import grpc
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from persys.agent_client import copy_from, copy_to, run_command
from persys.client import SchedulerClient
from persys.gateway.authorization import AUDIT_DETAIL
from persys.gateway.body_limit import BodyTooLarge
from persys.gateway.routes.common import WorkloadId
from persys.gateway.routes.logs import instance_target
from persys.gateway.schemas import (
    AGENT_ERRORS,
    INSTANCE_ID,
    SCHEDULER_ERRORS,
    TAR_ANSWER,
    TAR_BODY,
    TOO_LARGE,
    ExecAnswer,
    ExecBody,
)
from persys.tlsfiles import TLSFiles

AGENT_STATUS = {  # the agent's refusals as HTTP statuses
grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.FAILED_PRECONDITION: 409,
           grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.RESOURCE_EXHAUSTED: 413,
           grpc.StatusCode.DEADLINE_EXCEEDED: 504}
_EXEC_TYPES = ("container", "compose", "process")


def _error(message: str, status_code: int) -> JSONResponse:
    return JSONResponse({"error": message, "problems": []}, status_code=status_code)


def _agent_error(node_id: str, err: grpc.aio.AioRpcError) -> JSONResponse:
    return _error(f"agent on {node_id}: {err.details()}", AGENT_STATUS.get(err.code(), 502))


def refusal(name: str, kind: str, what: str) -> str:
    """Why `what` (exec, cp, console) cannot be done in a workload of this type; "" when it can."""
    vm = kind in ("vm", "microvm")
    if (what == "exec" and kind in _EXEC_TYPES) or (what == "cp" and kind == "container") or (what == "console" and vm):
        return ""
    if what == "console":
        return f"{name} is a {kind} workload: only VMs and microVMs have a serial console (`persysctl exec -t " \
               f"{name} -- sh` opens a shell)"
    if vm:
        return (f"{name} is a {kind}: {what} works in containers" + (", compose services and processes"
                if what == "exec" else "") + f"; its serial console is `persysctl console {name}`")
    if what == "cp":
        return f"{name} is a {kind} workload: cp copies files of container workloads only"
    return f"{name} is a {kind} workload: no exec there"


async def locate(client: SchedulerClient, agent_tls: TLSFiles | None, workload_id: str, instance: str,
                  what: str) -> tuple[str, str, str] | JSONResponse:
    """(instance, node, agent address) to ask, or the answer that says why there is none."""
    view = await client.get_workload(workload_id)
    why = refusal(workload_id, str(view.get("type", "")), what)
    if why:
        return _error(why, 409)
    target = await instance_target(client, agent_tls, view, workload_id, instance, what)
    if isinstance(target, JSONResponse):
        return target
    return target.instance, target.node, target.address


def _note(request: Request, **detail: Any) -> None:
    setattr(request.state, AUDIT_DETAIL, {k: str(v)[:1000] for k, v in detail.items()})


async def _exec(client: SchedulerClient, agent_tls: TLSFiles | None, request: Request, workload_id: str,
                body: ExecBody) -> JSONResponse:
    stdin = base64.b64decode(body.stdin)
    # The input's size is audited, never its content (it may be a secret piped in).
    given = {"stdinBytes": len(stdin)} if stdin else {}
    _note(request, workload=workload_id, command=shlex.join(body.command), instance=body.instance,
          service=body.service, **given)
    where = await locate(client, agent_tls, workload_id, body.instance, "exec")
    if isinstance(where, JSONResponse):
        return where
    inst, node_id, address = where
    assert agent_tls is not None
    try:
        res = await run_command(address, agent_tls, inst, list(body.command), service=body.service,
                                timeout_seconds=body.timeout, node_id=node_id, stdin=stdin)
    except grpc.aio.AioRpcError as err:
        return _agent_error(node_id, err)
    _note(request, workload=workload_id, command=shlex.join(body.command), instance=inst, node=node_id,
          service=body.service, exitCode=res.exit_code, timedOut=res.timed_out, **given)
    answer = ExecAnswer(instance=inst, node=node_id, runtime=res.runtime, target=res.target, exitCode=res.exit_code,
                        stdout=base64.b64encode(res.stdout).decode(), stderr=base64.b64encode(res.stderr).decode(),
                        truncated=res.truncated, timedOut=res.timed_out)
    return JSONResponse(answer.model_dump())


async def _download(client: SchedulerClient, agent_tls: TLSFiles | None, request: Request, workload_id: str,
                    instance: str, path: str) -> Response:
    _note(request, workload=workload_id, direction="from", file=path, instance=instance)
    where = await locate(client, agent_tls, workload_id, instance, "cp")
    if isinstance(where, JSONResponse):
        return where
    inst, node_id, address = where
    assert agent_tls is not None
    chunks = copy_from(address, agent_tls, inst, path, node_id=node_id)
    try:
        first = await anext(chunks)  # the agent's refusal, if any, comes before the first chunk
    except StopAsyncIteration:
        first = b""
    except grpc.aio.AioRpcError as err:
        await chunks.aclose()
        return _agent_error(node_id, err)

    async def body() -> AsyncIterator[bytes]:
        try:
            yield first
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

    _note(request, workload=workload_id, direction="from", file=path, instance=inst, node=node_id)
    return StreamingResponse(body(), media_type="application/x-tar")


async def _upload(client: SchedulerClient, agent_tls: TLSFiles | None, request: Request, workload_id: str,
                  instance: str, path: str) -> JSONResponse:
    _note(request, workload=workload_id, direction="to", file=path, instance=instance)
    where = await locate(client, agent_tls, workload_id, instance, "cp")
    if isinstance(where, JSONResponse):
        return where
    inst, node_id, address = where
    assert agent_tls is not None
    too_large: list[BodyTooLarge] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            async for piece in request.stream():  # counted against the copy limit by BodyLimit
                if piece:
                    yield piece
        except BodyTooLarge as err:
            too_large.append(err)
            raise  # gRPC cancels the upload; the agent deletes what it spooled

    try:
        res = await copy_to(address, agent_tls, inst, path, body(), node_id=node_id)
    except asyncio.CancelledError:
        if too_large:  # the cancellation is the upload's, not this request's
            raise too_large[0] from None
        raise
    except grpc.aio.AioRpcError as err:
        return _agent_error(node_id, err)
    _note(request, workload=workload_id, direction="to", file=res.detail, instance=inst, node=node_id,
          bytes=res.bytes)
    return JSONResponse({"instance": inst, "node": node_id, "path": res.detail, "bytes": res.bytes})


def exec_routes(client: SchedulerClient, agent_tls: TLSFiles | None) -> APIRouter:
    router = APIRouter()
    instance_q = Query("", pattern=f"^$|{INSTANCE_ID}", description="empty: the first instance")
    path_q = Query(..., min_length=1, max_length=4096, pattern="^/", description="absolute path in the container")

    @router.post("/v1/workloads/{workload_id}/exec", tags=["workloads"], response_model=ExecAnswer,
                 responses={**SCHEDULER_ERRORS, **TOO_LARGE, **AGENT_ERRORS})
    async def exec_command(request: Request, body: ExecBody, workload_id: str = WorkloadId) -> JSONResponse:
        """Run a command in a running instance and answer its exit code and output (no TTY; `stdin`, when
        given, is its input, then end of input):
        `docker exec` in a container or a compose service's container; for a process workload, on its
        node in the workload's environment (env, working directory, user, cgroups), not an isolated
        container. VMs take none. Output over 4 MiB is cut (`truncated`); the timeout kills it."""
        return await _exec(client, agent_tls, request, workload_id, body)

    @router.get("/v1/workloads/{workload_id}/files", tags=["workloads"], response_class=Response,
                responses={**TAR_ANSWER, **SCHEDULER_ERRORS, **TOO_LARGE, **AGENT_ERRORS})
    async def copy_out(request: Request, workload_id: str = WorkloadId, instance: str = instance_q,
                       path: str = path_q) -> Response:
        """A file or folder of a container instance as a tar archive (at most 64 MiB)."""
        return await _download(client, agent_tls, request, workload_id, instance, path)

    @router.put("/v1/workloads/{workload_id}/files", tags=["workloads"], openapi_extra=TAR_BODY,
                responses={**SCHEDULER_ERRORS, **TOO_LARGE, **AGENT_ERRORS})
    async def copy_in(request: Request, workload_id: str = WorkloadId, instance: str = instance_q,
                      path: str = path_q) -> JSONResponse:
        """Unpack a tar archive (one file or folder at its top, at most 64 MiB) in a container instance:
        into `path` when it is a folder there, else as `path`."""
        return await _upload(client, agent_tls, request, workload_id, instance, path)

    return router
