"""Server credentials that follow their files: a renewed certificate serves the next handshake,
without restarting the server or touching connections already open (gRPC asks the fetcher at
each new handshake; it answers None while the files are unchanged)."""

from __future__ import annotations

import logging

import grpc

from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)


class _Fetcher:
    def __init__(self, files: TLSFiles, require_client_auth: bool, send_ca: bool) -> None:
        self.files = files
        self.require_client_auth = require_client_auth
        self.send_ca = send_ca
        self.current = files.read()

    def config(self) -> grpc.ServerCertificateConfiguration:
        ca, cert, key = self.current
        chain = cert.rstrip(b"\n") + b"\n" + ca if self.send_ca else cert
        return grpc.ssl_server_certificate_configuration(
            [(key, chain)], root_certificates=ca if self.require_client_auth else None)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            now = self.files.read()
        except OSError as err:  # mid-replacement, or gone: keep serving what we have
            log.debug("TLS files unreadable, keeping the current ones: %s", err)
            return None
        if now == self.current:
            return None
        self.current = now
        log.info("serving the renewed certificate %s", self.files.cert)
        return self.config()


def reloading_server_credentials(files: TLSFiles, require_client_auth: bool = True, send_ca: bool = False
                                 ) -> grpc.ServerCredentials:
    """`send_ca`: the CA bundle follows the certificate in the handshake (the join listener: a
    joining node finds there the CA its pin names)."""
    fetcher = _Fetcher(files, require_client_auth, send_ca)
    return grpc.dynamic_ssl_server_credentials(fetcher.config(), fetcher,
                                               require_client_authentication=require_client_auth)
