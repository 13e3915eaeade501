"""The gateway's HTTPS certificate and trust, swapped for new handshakes while it serves.

uvicorn builds one SSLContext at start and asyncio's server keeps it. Its SNI callback (OpenSSL
calls it on every ClientHello, with or without a server name) moves each new connection onto the
newest context, so a renewed certificate or a rotated CA bundle applies from the next handshake
on, and connections already open keep theirs.
"""

from __future__ import annotations

import ssl

import uvicorn
from uvicorn.config import create_ssl_context

from persys.gateway.tls_gate import HandshakeGate
from persys.tlsfiles import TLSFiles


class ReloadingServerTLS:
    def __init__(self, config: uvicorn.Config, gate: HandshakeGate | None = None) -> None:
        if not config.loaded:
            config.load()
        assert config.ssl is not None, "the gateway always serves TLS"
        self._config = config
        self._current = config.ssl
        self._gate = gate  # the bound on connections (gateway.tls_gate), asked at each ClientHello
        config.ssl.sni_callback = self._pick

    def _pick(self, conn: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> int | None:
        if self._gate is not None and not self._gate.admit():
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR  # refused before the costly part of the handshake
        if conn.context is not self._current:
            conn.context = self._current
        return None

    def reload(self, tls: TLSFiles) -> None:
        """Read `tls` again (its files were replaced) for every handshake from now on."""
        c = self._config
        self._current = create_ssl_context(certfile=tls.cert, keyfile=tls.key, password=None,
                                           ssl_version=c.ssl_version, cert_reqs=c.ssl_cert_reqs, ca_certs=tls.ca,
                                           ciphers=c.ssl_ciphers)
