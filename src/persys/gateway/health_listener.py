"""`/healthz` on a listener of its own, answered by a thread (`persys gateway --health-listen`).

On the API port a probe shares the event loop with everything else: during a storm of new TLS
connections its own handshake and request wait behind theirs (3-12 s at load 10-14, issue #31).
This listener is plain HTTP (a liveness probe carries no secret and needs no identity; bind it
to a local or management address) and its thread answers from memory: the event loop's
heartbeat. Liveness stays truthful: a loop that has not beaten for `stall_after` seconds (hung,
not merely busy) is answered 503 "stalled", with the lag in both cases. Readiness (`/readyz`)
asks the scheduler and stays on the API port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

BEAT_EVERY_S = 0.25
STALL_AFTER_S = 30.0


class LoopBeat:
    """The event loop's heartbeat: `run` on the loop, `lag` from any thread."""

    def __init__(self, every: float = BEAT_EVERY_S) -> None:
        self.every = every
        self.last = time.monotonic()

    async def run(self) -> None:
        while True:
            self.last = time.monotonic()
            await asyncio.sleep(self.every)

    def lag(self) -> float:
        """Seconds the loop is late for its next beat (0 while it keeps time)."""
        return max(0.0, time.monotonic() - self.last - self.every)


def verdict(lag: float, stall_after: float = STALL_AFTER_S) -> tuple[int, dict[str, object]]:
    """(status, body) of /healthz for a loop `lag` seconds late (pure)."""
    body: dict[str, object] = {"status": "ok" if lag < stall_after else "stalled", "loopLagSeconds": round(lag, 3)}
    return (200 if lag < stall_after else 503), body


class HealthListener:
    def __init__(self, host: str, port: int, beat: LoopBeat, stall_after: float = STALL_AFTER_S) -> None:
        self.beat = beat
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body: dict[str, object]
                if self.path.split("?", 1)[0] != "/healthz":
                    status, body = 404, {"error": "only /healthz here (the API is on the gateway's HTTPS port)"}
                else:
                    status, body = verdict(listener.beat.lag(), stall_after)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a probe every few seconds is not worth a log line

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="gateway-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
