"""The answer budget of a read (issue #31): a GET of the API is answered within `seconds`, with
its data or, when the scheduler cannot give it in time, 503 + Retry-After (scheduler_gate). The
deadline is set for the request's task (`client.ANSWER_BY`), which every scheduler call made for
it reads. Streams and probes are not reads with an answer: they keep no budget (shedding.is_exempt).

Reads being answered are bounded too: beyond the gate's slots and queue (`SchedulerGate.max_calls
+ max_waiting`), a read is refused here, at the door, with 503 + Retry-After, before routing and
authorization spend anything on it (as gateway.shedding refuses beyond the requests in flight)."""

from __future__ import annotations

import json
import time

from persys.client import ANSWER_BY, OVERLOAD_RETRY_AFTER_S
from persys.gateway.scheduler_gate import SchedulerGate
from persys.gateway.shedding import App, Receive, Scope, Send, is_exempt

DEFAULT_READ_BUDGET_S = 1.5  # the answer within 2 s the issue asks, with room for the gateway's own part
# (`persys gateway --read-budget`; off there by default: model.limits.GatewayLimits says why)


def has_budget(method: str, path: str, query: bytes) -> bool:
    """Whether a request is a read of the API that gets the budget (pure)."""
    return method in ("GET", "HEAD") and path.startswith("/v1/") and not is_exempt(path, query)


class ReadBudget:
    """ASGI middleware: sets the answer deadline of API reads and bounds how many are answered at
    once (0 seconds: off)."""

    def __init__(self, app: App, seconds: float = DEFAULT_READ_BUDGET_S, gate: SchedulerGate | None = None) -> None:
        self.app = app
        self.seconds = seconds
        self.gate = gate
        self.admitted = 0  # reads being answered (with a gate: at most its slots and queue)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.seconds <= 0 or scope["type"] != "http"
                or not has_budget(scope["method"], scope["path"], scope.get("query_string", b""))):
            await self.app(scope, receive, send)
            return
        gate = self.gate
        if gate is not None and self.admitted >= gate.max_calls + gate.max_waiting:
            gate.shed += 1
            await _overloaded(send, gate, self.admitted)
            return
        token = ANSWER_BY.set(time.monotonic() + self.seconds)
        self.admitted += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.admitted -= 1
            ANSWER_BY.reset(token)


async def _overloaded(send: Send, gate: SchedulerGate, admitted: int) -> None:
    body = json.dumps({"error": f"the scheduler is overloaded: {admitted} reads being answered at the gateway "
                                f"({gate.in_flight} asking it, {gate.waiting} waiting); retry after "
                                f"{OVERLOAD_RETRY_AFTER_S}s", "code": "UNAVAILABLE", "problems": []}).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(OVERLOAD_RETRY_AFTER_S).encode())]})
    await send({"type": "http.response.body", "body": body})
