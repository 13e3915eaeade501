"""Server credentials that follow their files: a renewed certificate serves the next handshake,
without restarting the server or touching connections already open (gRPC asks the fetcher at
each new handshake; it answers None while the files are unchanged)."""

from __future__ import annotations

import logging

import grpc

from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)


class _Fetcher:
    def __init__(self, files: TLSFiles, require_client_auth: bool) -> None:
        self.files = files
        self.require_client_auth = require_client_auth
        self.current = files.read()

    def config(self) -> grpc.ServerCertificateConfiguration:
        ca, cert, key = self.current
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

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


def reloading_server_credentials(files: TLSFiles, require_client_auth: bool = True) -> grpc.ServerCredentials:
    fetcher = _Fetcher(files, require_client_auth)
    return grpc.dynamic_ssl_server_credentials(fetcher.config(), fetcher,
                                               require_client_authentication=require_client_auth)
