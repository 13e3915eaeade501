"""A bound on the TLS connections the gateway takes on at once, enforced at the ClientHello.

A TLS handshake costs the server a key exchange and a signature: a storm of 1,000 new connections
kept the gateway's one event loop busy 10-20 s at load 10-14 before a single request was read,
and `/healthz` waited behind them (issue #31). Shedding requests (gateway.shedding) comes too late
for that. The SNI callback, which OpenSSL calls on every ClientHello before any of the costly
work, asks the gate: beyond `max_connections` connections open or handshaking, the handshake is
aborted at once (an internal_error alert; asyncio closes the connection, the client may see only
the close), so excess clients learn within a round trip and retry, instead of queueing behind the
others' handshakes.

Counted: from the admitted ClientHello until the connection closes. A handshake that never
completes (the client went away) stops counting after `handshake_timeout` seconds.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from persys.gateway.authorization import PeerCertProtocol

DEFAULT_MAX_CONNECTIONS = 1024
HANDSHAKE_TIMEOUT_S = 10.0


class HandshakeGate:
    """Counts connections open and handshakes admitted (pure but for the clock it is given)."""

    def __init__(self, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_connections = max_connections
        self.handshake_timeout = handshake_timeout
        self._clock = clock
        self._pending: deque[float] = deque()  # when each admitted handshake began, oldest first
        self.open = 0
        self.refused = 0

    def handshaking(self) -> int:
        cutoff = self._clock() - self.handshake_timeout
        while self._pending and self._pending[0] < cutoff:
            self._pending.popleft()  # abandoned: the client never finished
        return len(self._pending)

    def admit(self) -> bool:
        """At a ClientHello: whether this handshake may go on."""
        if self.open + self.handshaking() >= self.max_connections:
            self.refused += 1
            return False
        self._pending.append(self._clock())
        return True

    def established(self) -> None:
        """A handshake finished: the connection now counts as open."""
        if self._pending:
            self._pending.popleft()
        self.open += 1

    def closed(self) -> None:
        self.open = max(0, self.open - 1)


def gated_protocol(gate: HandshakeGate) -> type[PeerCertProtocol]:
    """uvicorn's protocol class (one per connection, made at accept, told of the connection once
    its handshake is done), counting its connection in `gate`."""

    class GatedProtocol(PeerCertProtocol):
        def connection_made(self, transport: Any) -> None:
            gate.established()
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            gate.closed()
            super().connection_lost(exc)

    return GatedProtocol
