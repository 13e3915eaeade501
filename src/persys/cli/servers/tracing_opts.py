"""`--otlp-endpoint`, shared by `persys dev|scheduler|agent|gateway`, and the setup it starts."""

from __future__ import annotations

from collections.abc import Callable

import typer

from persys.cli.servers.errors import ServerError

OTLP_ENDPOINT = typer.Option(
    None, "--otlp-endpoint", metavar="URL",
    help="Export OpenTelemetry traces to this OTLP/gRPC receiver: http://host:4317 (plain) or https://host:4317 "
    "(TLS: system roots or $OTEL_EXPORTER_OTLP_CERTIFICATE; a client certificate from "
    "$OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and $OTEL_EXPORTER_OTLP_CLIENT_KEY). Default: "
    "$OTEL_EXPORTER_OTLP_ENDPOINT; neither: no tracing at all. Sampling: $OTEL_TRACES_SAMPLER_ARG, a ratio of "
    "new traces (default 1.0); a traced caller's decision is followed.")


def run_traced(service: str, endpoint: str | None, instance_id: str, run: Callable[[], None]) -> None:
    """`run()` with tracing set up for `service` (persys-scheduler, ...), spans flushed at the end."""
    from persys.observability import tracing  # here: `persys --help` never loads OpenTelemetry

    try:
        handle = tracing.setup_from(endpoint, service, instance_id)
    except tracing.TracingConfigError as err:
        raise ServerError(str(err)) from None
    try:
        run()
    finally:
        handle.shutdown()
