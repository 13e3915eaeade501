"""What the verified client certificate of a gRPC call says: identity (with groups) and host names.

TLS has checked the chain before any RPC runs; this only reads the subject and names. Parsed
certificates are cached by their PEM (one per connected peer, a handful of distinct ones).
"""

from __future__ import annotations

import functools

import grpc
from cryptography import x509

from persys.security.identity import ANONYMOUS, Identity, from_certificate


@functools.lru_cache(maxsize=1024)
def _parse(pem: bytes) -> tuple[Identity, frozenset[str]]:
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return from_certificate(cert), frozenset()
    names = {str(v) for v in san.get_values_for_type(x509.IPAddress)} | {
        v.lower() for v in san.get_values_for_type(x509.DNSName)}
    return from_certificate(cert), frozenset(names)


def _pem(context: grpc.aio.ServicerContext) -> bytes:
    pems = context.auth_context().get("x509_pem_cert") or []
    return pems[0] if pems else b""


def peer_identity_of(context: grpc.aio.ServicerContext) -> Identity:
    """The caller's identity, groups included (ANONYMOUS without a client certificate)."""
    pem = _pem(context)
    return _parse(pem)[0] if pem else ANONYMOUS


def peer_hosts(context: grpc.aio.ServicerContext) -> frozenset[str]:
    """The host names and addresses in the caller's certificate (lower-case DNS names, IPs as text)."""
    pem = _pem(context)
    return _parse(pem)[1] if pem else frozenset()
