"""gRPC server credentials that follow a renewing identity: new handshakes get the newest
certificate and trust bundle, connections already established (and their streams) stay as they are.

gRPC asks the fetcher before each handshake (from its own threads); it answers None while nothing
changed, so the common case costs one integer comparison.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from persys.security.live_identity import Material


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
