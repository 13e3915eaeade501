"""Who may scrape a scheduler's or agent's HTTPS metrics listener: the same roles as every other
client (`get metrics`: viewer and up), read from the verified client certificate. Prometheus
gets a user certificate in `persys:viewers` (docs/observability.md, "Metrics")."""

from __future__ import annotations

from functools import lru_cache

from cryptography import x509

from persys.observability.metrics import Metrics
from persys.observability.metrics_http import MetricsServer, server_context, start_metrics_server
from persys.security.identity import Identity, from_certificate
from persys.security.roles import decide
from persys.tlsfiles import TLSFiles

VERB, RESOURCE = "get", "metrics"


@lru_cache(maxsize=256)
def _identity(der: bytes) -> Identity:
    return from_certificate(x509.load_der_x509_certificate(der))


def may_scrape(der: bytes | None) -> tuple[int, str]:
    """(200, "") for a certificate whose identity holds `get metrics`; else 401/403 and why."""
    if not der:
        return 401, "a client certificate is required"
    try:
        identity = _identity(der)
    except ValueError:
        return 401, "unreadable client certificate"
    decision = decide(identity, VERB, RESOURCE)
    if not decision.allowed:
        return 403, f"{decision.reason} (needs {VERB} on {RESOURCE})"
    return 200, ""


async def serve_metrics(metrics: Metrics, tls: TLSFiles, listen: str = "", plain_listen: str = ""
                        ) -> list[MetricsServer]:
    """The listeners an operator configured: `listen` over HTTPS (client certificate from the
    cluster CA, `get metrics` checked), `plain_listen` over plain HTTP. Stops what it started
    if the second fails."""
    servers: list[MetricsServer] = []
    try:
        if listen:
            ctx = server_context(str(tls.ca), str(tls.cert), str(tls.key))
            servers.append(await start_metrics_server(metrics, listen, "--metrics-listen", ctx, may_scrape))
        if plain_listen:
            servers.append(await start_metrics_server(metrics, plain_listen, "--metrics-plain-listen"))
    except BaseException:
        for s in servers:
            await s.stop()
        raise
    return servers
