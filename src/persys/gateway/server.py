"""Serving the gateway over HTTPS with client-certificate verification (mutual TLS)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import uvicorn

from persys.client import SchedulerClient
from persys.gateway.app import create_app
from persys.gateway.health_listener import HealthListener, LoopBeat
from persys.gateway.intelligence_grpc import start_intelligence_grpc
from persys.gateway.routes.terminal_routes import TERMINAL_FRAME_MAX_BYTES
from persys.gateway.scheduler_gate import SchedulerGate
from persys.gateway.tls_gate import HandshakeGate, gated_protocol
from persys.gateway.tls_reload import ReloadingServerTLS
from persys.model.limits import GatewayLimits
from persys.observability.metrics import Metrics
from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the process that embeds it owns Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class RunningGateway:
    server: uvicorn.Server
    task: asyncio.Task[None]
    client: SchedulerClient
    port: int
    tls_files: TLSFiles
    server_tls: ReloadingServerTLS
    metrics: Metrics
    health: HealthListener | None = None  # --health-listen: /healthz answered by a thread
    beat: asyncio.Task[None] | None = None
    grpc_server: grpc.aio.Server | None = None  # Persys Intelligence over gRPC (--grpc-listen)
    grpc_port: int = 0

    async def reload_tls(self) -> None:
        """Its TLS files were replaced (a renewal): new handshakes, inbound and to the scheduler,
        use them; open connections keep what they had (agents are dialled per call anyway)."""
        self.server_tls.reload(self.tls_files)
        await self.client.reload_tls(self.tls_files)

    async def stop(self) -> None:
        if self.grpc_server is not None:
            await self.grpc_server.stop(1)
        self.server.should_exit = True
        await self.task
        await self.client.close()
        if self.health is not None:
            await asyncio.to_thread(self.health.stop)
        if self.beat is not None:
            self.beat.cancel()


# asyncio gives every TLS connection a 256 KiB plaintext read buffer (sslproto.SSLProtocol.max_size),
# allocated at accept: a storm of 1,000 connections held ~250 MiB in buffers alone. TLS records are
# at most 16 KiB, so 32 KiB reads lose nothing but a loop turn on large uploads.
SSL_READ_BUFFER = 32 * 1024


def _small_tls_buffers() -> None:
    import asyncio.sslproto

    if getattr(asyncio.sslproto.SSLProtocol, "max_size", 0) > SSL_READ_BUFFER:
        asyncio.sslproto.SSLProtocol.max_size = SSL_READ_BUFFER


async def start_gateway(scheduler_target: str, host: str, port: int, tls: TLSFiles,
                        limits: GatewayLimits | None = None, health_listen: tuple[str, int] | None = None,
                        grpc_listen: str = "") -> RunningGateway:
    """`grpc_listen` (host:port; port 0 picks one): also serve Persys Intelligence over gRPC."""
    _small_tls_buffers()
    # Bounded calls to the scheduler: an overloaded one sheds with 503 + Retry-After (gateway.scheduler_gate).
    client = SchedulerClient(scheduler_target, tls,
                             gate=SchedulerGate((limits or GatewayLimits()).max_scheduler_calls))
    metrics = Metrics()
    # TLS connections taken on at once: more are refused at their ClientHello (gateway.tls_gate).
    gate = HandshakeGate((limits or GatewayLimits()).max_connections)
    app = create_app(client, agent_tls=tls, limits=limits, metrics=metrics)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=str(tls.cert),
        ssl_keyfile=str(tls.key),
        ssl_ca_certs=str(tls.ca),
        # A certificate is verified when presented; without one a request needs a bearer token
        # (the authorization middleware answers 401 otherwise).
        ssl_cert_reqs=ssl.CERT_OPTIONAL,
        http=gated_protocol(gate),  # PeerCertProtocol, counted in the gate
        ws="websockets-sansio",  # interactive terminals (routes/terminal_routes.py)
        ws_max_size=TERMINAL_FRAME_MAX_BYTES,
        log_level="warning",
        lifespan="off",
        # Idle keep-alive clients must not hold a shutdown forever.
        timeout_graceful_shutdown=3,
    )
    server_tls = ReloadingServerTLS(config, gate)
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve(), name="gateway")
    while not server.started:
        if task.done():
            await task  # re-raises the startup error (e.g. port in use)
            raise OSError(f"gateway could not start on {host}:{port}")
        await asyncio.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
    log.info("gateway listening on https://%s:%d", host, bound)
    gw = RunningGateway(server, task, client, bound, tls, server_tls, metrics)
    if health_listen is not None:
        beat = LoopBeat()
        gw.beat = asyncio.create_task(beat.run(), name="gateway-beat")
        gw.health = HealthListener(*health_listen, beat)
        gw.health.start()
        log.info("gateway /healthz also on http://%s:%d (its own thread)", health_listen[0], gw.health.port)
    if grpc_listen:
        try:
            gw.grpc_server, gw.grpc_port = await start_intelligence_grpc(app.state.intelligence, client, tls,
                                                                         grpc_listen)
        except BaseException:
            await gw.stop()
            raise
    return gw
