"""The agent's own gRPC service (AgentService): data the control plane should not relay.

It sees the agent through `ServedNode` only (which runtimes may hold an instance, where the
agent keeps its files), so it imports nothing from the agent loop. The client side of these
calls is `persys.agent_client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Protocol

import grpc

from persys._pb.persys.v1 import agent_pb2 as apb
from persys._pb.persys.v1 import agent_pb2_grpc as apb_grpc
from persys.aborting import abort
from persys.agent.image_usage import images_in_use
from persys.agent.images_catalog import CatalogError, list_images, remove_image
from persys.agent.images_loader import LoadError, load_image
from persys.agent.runtimes.base import Runtime, RuntimeFailure
from persys.agent.runtimes.exec_output import Copies, Executes
from persys.agent.runtimes.log_stream import LogQuery, UnsupportedQuery
from persys.agent.runtimes.terminal import NO_EXIT_CODE, READ_MAX, HasConsole, HasTerminal, Terminal
from persys.agent.runtimes.vm.images import ImageRegistry
from persys.model import WorkloadSpec
from persys.model.limits import (
    COPY_MAX_BYTES,
    EXEC_STDIN_MAX_BYTES,
    EXEC_TIMEOUT_MAX_SECONDS,
    EXEC_TIMEOUT_SECONDS,
    human_bytes,
)
from persys.observability import tracing
from persys.observability.grpc_metrics import MetricsInterceptor
from persys.observability.grpc_tracing import TracingInterceptor
from persys.observability.metrics import Metrics
from persys.security.grpc_reload import reloading_file_credentials
from persys.security.grpc_tls import SERVER_KEEPALIVE_OPTIONS, peer_identity
from persys.security.permissions import AGENT_SERVICE, agent_caller_refusal
from persys.tlsfiles import TLSFiles

_CHUNK = 1 << 20
# RuntimeFailure codes of exec and cp, as gRPC answers them (others: UNAVAILABLE).
_STATUS = {"NotFound": grpc.StatusCode.NOT_FOUND, "NotRunning": grpc.StatusCode.FAILED_PRECONDITION,
           "InvalidArgument": grpc.StatusCode.INVALID_ARGUMENT, "TooLarge": grpc.StatusCode.RESOURCE_EXHAUSTED,
           "InUse": grpc.StatusCode.FAILED_PRECONDITION}


class ServedNode(Protocol):
    """What AgentService needs from the agent."""

    @property
    def node_id(self) -> str: ...

    @property
    def state_dir(self) -> Path: ...

    @property
    def image_max_bytes(self) -> int: ...

    def log_sources(self, workload_id: str) -> tuple[Sequence[Runtime], bool]:
        """Runtimes that may hold the instance, and whether it is desired here (if not, a
        runtime is asked only when it knows the instance)."""
        ...

    def exec_source(self, instance_id: str) -> tuple[str, Runtime | None]:
        """The workload type of an instance desired on this node and the runtime that runs it
        ("" and None when it is not desired here: exec and cp act only on this node's instances)."""
        ...

    def desired_specs(self) -> list[tuple[str, WorkloadSpec]]:
        """(instance id, spec) of every instance desired on this node."""
        ...


class AgentServiceImpl(apb_grpc.AgentServiceServicer):
    def __init__(self, node: ServedNode) -> None:
        self.node = node
        self.access = WorkloadAccess(node)

    async def Exec(self, request: apb.ExecRequest, context: grpc.aio.ServicerContext) -> apb.ExecResult:
        return await self.access.exec(request, context)

    async def CopyFrom(self, request: apb.CopyFromRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[apb.FileChunk]:
        async for chunk in self.access.copy_from(request, context):
            yield chunk

    async def CopyTo(self, request_iterator: AsyncIterator[apb.FileChunk], context: grpc.aio.ServicerContext
                     ) -> apb.CopyResult:
        return await self.access.copy_to(request_iterator, context)

    async def Attach(self, request_iterator: AsyncIterator[apb.TerminalInput], context: grpc.aio.ServicerContext
                     ) -> AsyncIterator[apb.TerminalOutput]:
        async for out in self.access.attach(request_iterator, context):
            yield out

    async def _log_runtime(self, wid: str, context: grpc.aio.ServicerContext, method: str) -> Runtime:
        """The runtime holding instance `wid` here (aborts NOT_FOUND when none does)."""
        await require_caller(context, method)
        candidates, desired = self.node.log_sources(wid)
        for rt in candidates:
            try:
                if desired or await rt.inspect(wid) is not None:
                    return rt
            except RuntimeFailure as err:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        await abort(context, grpc.StatusCode.NOT_FOUND, f"{wid} is not on node {self.node.node_id}")

    async def GetLogs(self, request: apb.LogsRequest, context: grpc.aio.ServicerContext) -> apb.LogsResponse:
        rt = await self._log_runtime(request.instance_id, context, "GetLogs")
        query = _query(request, follow=False)
        try:
            if query == LogQuery(tail=query.tail):  # the plain tail every runtime has always served
                return apb.LogsResponse(text=await rt.logs(request.instance_id, query.tail), runtime=rt.name)
            pieces = [p async for p in rt.stream_logs(request.instance_id, query)]
        except UnsupportedQuery as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except RuntimeFailure as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        return apb.LogsResponse(text="".join(pieces), runtime=rt.name)

    async def StreamLogs(self, request: apb.LogsRequest, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[apb.LogsResponse]:
        """Each piece is written before the next is read: gRPC flow control paces the source to the
        caller. A caller that leaves cancels this handler, which closes the source."""
        rt = await self._log_runtime(request.instance_id, context, "StreamLogs")
        stream = rt.stream_logs(request.instance_id, _query(request, follow=True))
        try:
            await anext(stream, None)  # ACCEPTED, or the refusal as an error before any message
            yield apb.LogsResponse(runtime=rt.name)  # the caller knows now that output will follow
            async for piece in stream:
                yield apb.LogsResponse(text=piece)
        except UnsupportedQuery as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except RuntimeFailure as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def LoadImage(self, request_iterator: AsyncIterator[apb.ImageChunk], context: grpc.aio.ServicerContext
                        ) -> apb.ImageResult:
        await require_caller(context, "LoadImage")
        spool = self.node.state_dir / "incoming"
        spool.mkdir(parents=True, exist_ok=True)
        kind = name = ""
        received, cap = 0, self.node.image_max_bytes
        fd, tmp = tempfile.mkstemp(dir=spool)
        try:
            # Streamed to disk chunk by chunk, never whole in memory; the spool file goes in
            # `finally` whatever happens (over the cap, a cancelled upload, a failed load).
            with os.fdopen(fd, "wb") as f:
                async for chunk in request_iterator:
                    kind, name = kind or chunk.kind, name or chunk.name
                    received += len(chunk.data)
                    if received > cap:
                        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                            f"image exceeds the upload limit of {human_bytes(cap)}")
                    await asyncio.to_thread(f.write, chunk.data)
            try:
                detail = await load_image(kind, name, Path(tmp), self.node.state_dir / "runtimes")
            except LoadError as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            return apb.ImageResult(name=name, detail=detail)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


    def _runtimes_dir(self) -> Path:
        return self.node.state_dir / "runtimes"

    async def ListImages(self, request: apb.ListImagesRequest, context: grpc.aio.ServicerContext
                         ) -> apb.ListImagesResponse:
        await require_caller(context, "ListImages")
        used = images_in_use(self.node.desired_specs())
        images, unavailable = await list_images(ImageRegistry(self._runtimes_dir()), used)
        return apb.ListImagesResponse(
            images=[apb.NodeImage(kind=i.kind, name=i.name, id=i.id, size=i.size, created=i.created,
                                  used_by=i.used_by, format=i.format) for i in images],
            unavailable=unavailable)

    async def RemoveImage(self, request: apb.RemoveImageRequest, context: grpc.aio.ServicerContext
                          ) -> apb.ImageResult:
        await require_caller(context, "RemoveImage")
        used = images_in_use(self.node.desired_specs())
        try:
            detail = await remove_image(request.kind, request.name, ImageRegistry(self._runtimes_dir()), used,
                                        self._runtimes_dir() / "vm")
        except CatalogError as err:
            await context.abort(_STATUS.get(err.code, grpc.StatusCode.UNAVAILABLE), str(err))
        return apb.ImageResult(name=request.name, detail=detail)


async def require_caller(context: grpc.aio.ServicerContext, method: str) -> None:
    """Abort PERMISSION_DENIED unless the caller's certificate may call `method` (security.permissions)."""
    refusal = agent_caller_refusal(AGENT_SERVICE + method, peer_identity(context))
    if refusal:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)


def _query(request: apb.LogsRequest, *, follow: bool) -> LogQuery:
    # tail 0: none when following or with since (only new, or all since), else 100 as it always was
    tail = request.tail or (0 if follow or request.since else 100)
    return LogQuery(tail=tail, since=request.since, follow=follow, service=request.service,
                    timestamps=request.timestamps)

class Refused(Exception):
    """A refusal to answer once the call's own files are cleaned up (then `context.abort`)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class WorkloadAccess:
    """Exec and cp (AgentService.Exec, CopyFrom, CopyTo): inside this node's instances, for the
    gateway only. Spooled archives live under the agent's `incoming/` and go when the call ends."""

    def __init__(self, node: ServedNode) -> None:
        self.node = node

    def find(self, instance_id: str, what: str) -> Runtime:
        """The runtime of an instance desired here that can do `what` (exec, cp); Refused if none."""
        kind, rt = self.node.exec_source(instance_id)
        if rt is None:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"{instance_id or '(none)'} is not on node {self.node.node_id}")
        if not isinstance(rt, Executes if what == "exec" else Copies):
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{instance_id} is a {kind}: no {what} there")
        return rt

    async def runtime(self, context: grpc.aio.ServicerContext, instance_id: str, what: str) -> Runtime:
        try:
            return self.find(instance_id, what)
        except Refused as r:
            await abort(context, r.code, r.message)

    @staticmethod
    async def failed(context: grpc.aio.ServicerContext, err: RuntimeFailure) -> None:
        await context.abort(_STATUS.get(err.code, grpc.StatusCode.UNAVAILABLE), str(err.args[0]))

    def spool(self) -> Path:
        spool = self.node.state_dir / "incoming"
        spool.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=spool, prefix="copy-")
        os.close(fd)
        return Path(tmp)

    async def exec(self, request: apb.ExecRequest, context: grpc.aio.ServicerContext) -> apb.ExecResult:
        await require_caller(context, "Exec")
        rt = await self.runtime(context, request.instance_id, "exec")
        if not request.command or not request.command[0]:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "command: empty")
        if len(request.stdin) > EXEC_STDIN_MAX_BYTES:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"stdin: more than {human_bytes(EXEC_STDIN_MAX_BYTES)}")
        timeout = min(request.timeout_seconds or EXEC_TIMEOUT_SECONDS, EXEC_TIMEOUT_MAX_SECONDS)
        try:
            out = await rt.exec(request.instance_id, list(request.command), service=request.service,  # type: ignore[attr-defined]
                                kill_after=timeout, stdin=request.stdin)
        except RuntimeFailure as err:
            await self.failed(context, err)
        return apb.ExecResult(exit_code=out.exit_code, stdout=out.stdout, stderr=out.stderr, truncated=out.truncated,
                              timed_out=out.timed_out, runtime=rt.name, target=out.target)

    async def open_terminal(self, first: apb.TerminalInput) -> tuple[Runtime, Terminal]:
        """The terminal the opening message asks for; Refused when it cannot be had."""
        if first.what not in ("console", "exec"):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"what: {first.what[:50]!r} is neither console nor exec")
        kind, rt = self.node.exec_source(first.instance_id)
        if rt is None:
            raise Refused(grpc.StatusCode.NOT_FOUND,
                          f"{first.instance_id or '(none)'} is not on node {self.node.node_id}")
        try:
            if first.what == "console":
                if not isinstance(rt, HasConsole):
                    raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{first.instance_id} is a {kind}: it has no "
                                                                       "serial console (exec -t runs a shell in it)")
                return rt, await rt.open_console(first.instance_id)
            if not isinstance(rt, HasTerminal):
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{first.instance_id} is a {kind}: no exec there "
                                                                   "(its serial console is `persysctl console`)")
            if not first.command or not first.command[0]:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "command: empty")
            return rt, await rt.open_terminal(first.instance_id, list(first.command), service=first.service,
                                              cols=first.cols, rows=first.rows)
        except RuntimeFailure as err:
            raise Refused(_STATUS.get(err.code, grpc.StatusCode.UNAVAILABLE), str(err.args[0])) from None

    async def attach(self, request_iterator: AsyncIterator[apb.TerminalInput], context: grpc.aio.ServicerContext
                     ) -> AsyncIterator[apb.TerminalOutput]:
        """A terminal, both ways, until its output ends (the VM stopped, the command exited) or the
        caller leaves (gRPC cancels this; the terminal is closed either way)."""
        await require_caller(context, "Attach")
        first = await anext(aiter(request_iterator), None)
        try:
            if first is None:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "no opening message (instance_id, what)")
            rt, term = await self.open_terminal(first)
        except Refused as r:
            await abort(context, r.code, r.message)

        feeder = asyncio.create_task(_feed(term, first, request_iterator))
        code = NO_EXIT_CODE
        try:
            yield apb.TerminalOutput(ready=True, runtime=rt.name, target=term.target)
            while data := await term.read():
                yield apb.TerminalOutput(data=data)
        finally:
            feeder.cancel()
            code = await asyncio.shield(term.close())
        if feeder.done() and not feeder.cancelled() and isinstance(feeder.exception(), Refused):
            refused = feeder.exception()
            assert isinstance(refused, Refused)
            await context.abort(refused.code, refused.message)
        detail = ("the console closed (the VM stopped)" if first.what == "console" else
                  f"exited with {code}" if code != NO_EXIT_CODE else "ended")
        yield apb.TerminalOutput(ended=True, exit_code=code, detail=detail)

    async def copy_from(self, request: apb.CopyFromRequest, context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[apb.FileChunk]:
        await require_caller(context, "CopyFrom")
        rt = await self.runtime(context, request.instance_id, "cp")
        tmp = self.spool()
        try:
            # Whole on disk first, so a failure (absent path, over the cap) comes before any chunk.
            try:
                await rt.copy_from(request.instance_id, request.path, tmp)  # type: ignore[attr-defined]
            except RuntimeFailure as err:
                tmp.unlink(missing_ok=True)  # before the answer (abort sends it at once)
                await self.failed(context, err)
            with tmp.open("rb") as f:
                while chunk := await asyncio.to_thread(f.read, _CHUNK):
                    yield apb.FileChunk(instance_id=request.instance_id, path=request.path, data=chunk)
        finally:
            tmp.unlink(missing_ok=True)

    async def copy_to(self, request_iterator: AsyncIterator[apb.FileChunk], context: grpc.aio.ServicerContext
                      ) -> apb.CopyResult:
        await require_caller(context, "CopyTo")
        tmp = self.spool()
        instance = path = ""
        received = 0
        # Every refusal is answered after the spooled archive is gone: abort sends the status at
        # once, and a caller reading it must find nothing left behind.
        try:
            try:
                with tmp.open("wb") as f:
                    async for chunk in request_iterator:
                        instance, path = instance or chunk.instance_id, path or chunk.path
                        received += len(chunk.data)
                        if received > COPY_MAX_BYTES:
                            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "the archive exceeds the copy limit "
                                                                              f"of {human_bytes(COPY_MAX_BYTES)}")
                        await asyncio.to_thread(f.write, chunk.data)
                rt = self.find(instance, "cp")
                try:
                    where = await rt.copy_to(instance, path, tmp)  # type: ignore[attr-defined]
                except RuntimeFailure as err:
                    raise Refused(_STATUS.get(err.code, grpc.StatusCode.UNAVAILABLE), str(err.args[0])) from None
                return apb.CopyResult(detail=where, bytes=received)
            finally:
                tmp.unlink(missing_ok=True)
        except Refused as r:
            await abort(context, r.code, r.message)


async def _feed(term: Terminal, first: apb.TerminalInput, rest: AsyncIterator[apb.TerminalInput]) -> None:
    """The caller's keystrokes and window sizes into the terminal, the opening message's first."""
    msg: apb.TerminalInput | None = first
    while msg is not None:
        if len(msg.data) > READ_MAX:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"data: more than {READ_MAX} bytes in a message")
        if msg.cols and msg.rows and msg is not first:  # the first's size was given at the opening
            await term.resize(min(msg.cols, 1000), min(msg.rows, 1000))
        if msg.data:
            await term.write(msg.data)
        msg = await anext(rest, None)


async def serve(node: ServedNode, listen: str, tls: TLSFiles, metrics: Metrics | None = None
                ) -> tuple[grpc.aio.Server, int]:
    # Traced (a span per unary call, e.g. GetLogs, child of the gateway's request) when tracing is on.
    interceptors = ([TracingInterceptor()] if tracing.enabled() else []) + \
        ([MetricsInterceptor(metrics)] if metrics is not None else [])
    server = grpc.aio.server(options=SERVER_KEEPALIVE_OPTIONS, interceptors=interceptors)
    apb_grpc.add_AgentServiceServicer_to_server(AgentServiceImpl(node), server)
    # A renewed node certificate serves the next handshake (persys.agent.cert_renewal).
    port = server.add_secure_port(listen, reloading_file_credentials(tls))
    if port == 0:
        raise OSError(f"agent cannot listen on {listen}")
    await server.start()
    return server, port
