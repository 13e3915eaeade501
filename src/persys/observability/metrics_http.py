"""`GET /metrics` on a listener of its own, for the scheduler and the agent (the gateway serves
it on its HTTPS API instead).

A deliberately small HTTP/1.1 server on asyncio streams: one request per connection, the
request line and headers bounded (`MAX_HEAD_BYTES`, `READ_TIMEOUT_SECONDS`), only `GET
/metrics`. It runs on the process's event loop, so the scrape-time collectors read the
process's state from the thread that owns it. Two flavours:

* HTTPS with a client certificate required (the cluster CA) and checked by `authorize`, which
  the caller supplies (security.metrics_access: the roles, as for every other client);
* plain HTTP, only where an operator asks for it (`--metrics-plain-listen 127.0.0.1:9464` for a
  Prometheus on the same host): anyone who can connect may read.

Rendering is budgeted: a scrape reuses the last text while it is younger than `CACHE_SECONDS`,
or than `1 / LOOP_SHARE_MAX` times what rendering it took, whichever is longer, so scrapes never
take more than that share of the event loop however often they come and however large the
mirror (a 20,000-workload mirror renders in ~40 ms: a Prometheus scraping every second gets a
text up to 2 s old, and the scheduler keeps its loop for placements).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from persys.observability.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
READ_TIMEOUT_SECONDS = 10.0
CACHE_SECONDS = 1.0  # scrapes closer together than this get the same text
LOOP_SHARE_MAX = 0.02  # of the event loop's time that rendering may take, scraped as often as it may be
# (status, message): 200 lets the scrape through; anything else is the refusal sent back.
Authorize = Callable[[bytes | None], tuple[int, str]]
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 431: "Request Header Fields Too Large"}


def reuse_seconds(render_seconds: float) -> float:
    """How long a rendered text is served again, given what rendering it took. Pure."""
    return max(CACHE_SECONDS, render_seconds / LOOP_SHARE_MAX)


def parse_listen(value: str, option: str) -> tuple[str, int]:
    """`host:port` (port 0: any free one) -> (host, port), or ValueError naming the option."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{option} {value!r}: expected host:port (port 0 picks a free one)")
    return host.strip("[]"), int(port)


def _response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def route(request_line: str) -> tuple[int, str]:
    """What a request line gets, before authorization: (200, "") for `GET /metrics`."""
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return 400, "malformed request line"
    method, target = parts[0], parts[1]
    path = target.split("?", 1)[0]
    if path != "/metrics":
        return 404, "only /metrics is served here"
    if method != "GET":
        return 405, "only GET /metrics"
    return 200, ""


class MetricsListenError(ValueError):
    """The listener could not be opened (address in use, not local): one line for the operator."""


@dataclass
class MetricsServer:
    server: asyncio.Server
    port: int
    scheme: str

    async def stop(self) -> None:
        self.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 2.0)


class _Handler:
    def __init__(self, metrics: Metrics, authorize: Authorize | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self.authorize = authorize
        self.clock = clock
        self._text, self._fresh_until = b"", float("-inf")

    def exposition(self) -> bytes:
        """The text, rendered again only when the last one has served its `reuse_seconds`: a
        scrape holds the event loop for a while on a large mirror, so a client asking in a loop
        must not stall the process."""
        now = self.clock()
        if now >= self._fresh_until:
            self._text = self.metrics.exposition()
            self._fresh_until = now + reuse_seconds(self.clock() - now)
        return self._text

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await self._answer(reader, writer))
            await writer.drain()
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_SECONDS)
        except asyncio.LimitOverrunError:
            return _response(431, b"request head too large\n")
        status, message = route(head.split(b"\r\n", 1)[0].decode("latin-1"))
        if status == 200 and self.authorize is not None:
            ssl_object = writer.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            status, message = self.authorize(der)
        if status != 200:
            return _response(status, f"{message}\n".encode())
        return _response(200, self.exposition(), CONTENT_TYPE)


def server_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """TLS that requires a client certificate from the cluster CA."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    ctx.load_cert_chain(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


async def start_metrics_server(metrics: Metrics, listen: str, option: str, tls: ssl.SSLContext | None = None,
                               authorize: Authorize | None = None) -> MetricsServer:
    """Serve `metrics` on `listen` (host:port). With `tls`, `authorize` is required: every
    scrape over TLS is checked. Returns the bound port (port 0: the kernel's choice)."""
    if tls is not None and authorize is None:
        raise ValueError("an HTTPS metrics listener needs an authorization check")
    host, port = parse_listen(listen, option)
    handler = _Handler(metrics, authorize if tls else None)
    try:
        if tls is not None:
            server = await asyncio.start_server(handler, host, port, ssl=tls, limit=MAX_HEAD_BYTES,
                                                ssl_handshake_timeout=READ_TIMEOUT_SECONDS)
        else:
            server = await asyncio.start_server(handler, host, port, limit=MAX_HEAD_BYTES)
    except OSError as err:
        raise MetricsListenError(f"{option} {listen}: {err.strerror or err}") from None
    bound = int(server.sockets[0].getsockname()[1])
    scheme = "https" if tls else "http"
    log.info("metrics on %s://%s:%d/metrics", scheme, host, bound)
    return MetricsServer(server, bound, scheme)
