"""gRPC server credentials that follow a renewing identity: new handshakes get the newest
certificate and trust bundle, connections already established (and their streams) stay as they are.

gRPC asks the fetcher before each handshake (from its own threads); it answers None while nothing
changed, so the common case costs one integer comparison (for credentials that follow files, one
read of the three files).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from persys.security.live_identity import Material
from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)


def _configuration(m: Material) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(m.key_pem, m.cert_pem)], root_certificates=m.ca_pem)


def reloading_server_credentials(current: Callable[[], Material]) -> grpc.ServerCredentials:
    """Mutual-TLS server credentials (a client certificate is required) read from `current()`."""
    first = current()
    served = [first.generation]
    lock = threading.Lock()

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        m = current()
        with lock:
            if m.generation == served[0]:
                return None
            served[0] = m.generation
        return _configuration(m)

    return grpc.dynamic_ssl_server_credentials(_configuration(first), fetch, require_client_authentication=True)


class _FileFetcher:
    def __init__(self, files: TLSFiles, require_client_auth: bool, send_ca: bool) -> None:
        self.files = files
        self.require_client_auth = require_client_auth
        self.send_ca = send_ca
        self.current = files.read()
        self.lock = threading.Lock()  # gRPC calls the fetcher from its own threads

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
        with self.lock:
            if now == self.current:
                return None
            self.current = now
        log.info("serving the renewed certificate %s", self.files.cert)
        return self.config()


def reloading_file_credentials(files: TLSFiles, require_client_auth: bool = True, send_ca: bool = False
                                 ) -> grpc.ServerCredentials:
    """Server credentials read from `files` again whenever they change (a node's certificate
    renewed on disk, the join listener's). `send_ca`: the CA bundle follows the certificate in the
    handshake (the join listener: a joining node finds there the CA its pin names)."""
    fetcher = _FileFetcher(files, require_client_auth, send_ca)
    return grpc.dynamic_ssl_server_credentials(fetcher.config(), fetcher,
                                               require_client_authentication=require_client_auth)
