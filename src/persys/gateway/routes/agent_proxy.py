"""Routes the gateway serves by calling a node's agent over mutual TLS: image upload, listing and
removal (logs: routes/logs.py; exec and cp: routes/exec_routes.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from persys.agent_client import list_images, remove_image, send_image
from persys.client import SchedulerClient
from persys.gateway.body_limit import BodyTooLarge
from persys.gateway.routes.common import NodeId
from persys.gateway.schemas import (
    AGENT_ERRORS,
    IMAGE_BODY,
    SCHEDULER_ERRORS,
    TOO_LARGE,
    HeldImageKind,
    ImageKind,
    NodeImages,
    NodeImageView,
)
from persys.tlsfiles import TLSFiles


def _error(message: str, status_code: int) -> JSONResponse:
    return JSONResponse({"error": message, "problems": []}, status_code=status_code)


async def _agent_address(client: SchedulerClient, agent_tls: TLSFiles | None, node_id: str) -> str | JSONResponse:
    node = await client.get_node(node_id)
    if not node.get("address") or agent_tls is None:
        return _error(f"the agent on {node_id} serves no image endpoint", 501)
    return str(node["address"])


async def _load_image(client: SchedulerClient, agent_tls: TLSFiles | None, request: Request, node_id: str,
                      kind: str, name: str) -> JSONResponse:
    address = await _agent_address(client, agent_tls, node_id)
    if isinstance(address, JSONResponse):
        return address
    assert agent_tls is not None
    too_large: list[BodyTooLarge] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            async for piece in request.stream():  # counted against the image limit by BodyLimit
                if piece:
                    yield piece
        except BodyTooLarge as err:
            too_large.append(err)
            raise  # gRPC cancels the upload; the agent deletes what it spooled

    try:
        detail = await send_image(address, agent_tls, kind, name, body(), node_id=node_id)
    except asyncio.CancelledError:
        if too_large:  # the cancellation is the upload's, not this request's
            raise too_large[0] from None
        raise
    except grpc.aio.AioRpcError as err:
        codes = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.RESOURCE_EXHAUSTED: 413}
        return _error(f"agent on {node_id}: {err.details()}", codes.get(err.code(), 502))
    return JSONResponse({"node": node_id, "detail": detail})


# How an agent's refusal of an image call reads over REST.
_AGENT_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404,
                 grpc.StatusCode.FAILED_PRECONDITION: 409, grpc.StatusCode.PERMISSION_DENIED: 403,
                 grpc.StatusCode.RESOURCE_EXHAUSTED: 413}


async def _list_images(client: SchedulerClient, agent_tls: TLSFiles | None, node_id: str) -> JSONResponse:
    address = await _agent_address(client, agent_tls, node_id)
    if isinstance(address, JSONResponse):
        return address
    assert agent_tls is not None
    try:
        resp = await list_images(address, agent_tls, node_id=node_id)
    except grpc.aio.AioRpcError as err:
        return _error(f"agent on {node_id}: {err.details()}", _AGENT_STATUS.get(err.code(), 502))
    views = [NodeImageView(kind=i.kind, name=i.name, id=i.id, size=i.size, createdAt=i.created,  # type: ignore[arg-type]
                           usedBy=list(i.used_by), format=i.format) for i in resp.images]
    return JSONResponse(NodeImages(node=node_id, images=views, unavailable=list(resp.unavailable)).model_dump())


async def _remove_image(client: SchedulerClient, agent_tls: TLSFiles | None, node_id: str, kind: str,
                        name: str) -> JSONResponse:
    address = await _agent_address(client, agent_tls, node_id)
    if isinstance(address, JSONResponse):
        return address
    assert agent_tls is not None
    try:
        detail = await remove_image(address, agent_tls, kind, name, node_id=node_id)
    except grpc.aio.AioRpcError as err:
        return _error(f"agent on {node_id}: {err.details()}", _AGENT_STATUS.get(err.code(), 502))
    return JSONResponse({"node": node_id, "detail": detail})


def agent_routes(client: SchedulerClient, agent_tls: TLSFiles | None) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/nodes/{node_id}/images", tags=["nodes"], openapi_extra=IMAGE_BODY,
                 responses={**SCHEDULER_ERRORS, **TOO_LARGE, **AGENT_ERRORS})
    async def load_image(request: Request, node_id: str = NodeId, kind: ImageKind = "docker",
                         name: str = Query("", max_length=255)) -> JSONResponse:
        """Put an image on a node (the body is the file, streamed through to the node's disk): kind docker
        (a `docker save` tarball), rootfs (a filesystem tarball imported as `name`), or disk / kernel / initrd
        for VMs (registered as `name`)."""
        return await _load_image(client, agent_tls, request, node_id, kind, name)

    @router.get("/v1/nodes/{node_id}/images", tags=["nodes"], response_model=NodeImages,
                responses={**SCHEDULER_ERRORS, **AGENT_ERRORS})
    async def get_images(node_id: str = NodeId) -> JSONResponse:
        """The images a node holds: its container engine's (one entry per tag) and its VM image registry's,
        each with the instances desired there that use it."""
        return await _list_images(client, agent_tls, node_id)

    @router.delete("/v1/nodes/{node_id}/images", tags=["nodes"],
                   responses={**SCHEDULER_ERRORS, **AGENT_ERRORS})
    async def delete_image(node_id: str = NodeId, kind: HeldImageKind = "docker",
                           name: str = Query(..., min_length=1, max_length=255)) -> JSONResponse:
        """Remove an image from a node: 404 when it is not there, 409 while an instance desired on the node
        (or, for the container engine, any container) uses it. A VM image's file stays while a VM disk on the
        node is based on it."""
        return await _remove_image(client, agent_tls, node_id, kind, name)

    return router
