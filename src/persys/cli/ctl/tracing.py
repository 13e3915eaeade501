"""persysctl's tracing: one CLIENT span per command, its context sent to the gateway in the
`traceparent` header, exported before the command exits.

Read from the same environment as the servers (`OTEL_EXPORTER_OTLP_ENDPOINT`, or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, and `OTEL_TRACES_SAMPLER_ARG`); without an endpoint
OpenTelemetry is not even imported, and requests carry no header.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
GROUPS = frozenset({"admin", "policy", "auth", "secret", "node"})  # commands with subcommands
EXPORT_TIMEOUT = 2.0  # seconds a command may wait at exit for a receiver that does not answer
_WORD = re.compile(r"[a-z][a-z-]{0,30}")


class _On:
    on = False


def command_name(argv: Sequence[str], known: Collection[str]) -> str:
    """The span's name: the command's words, never its arguments or option values (a workload
    name, a file, a --token value): the first word that is a `known` command, and for a group
    the word after it when it looks like a subcommand."""
    for i, word in enumerate(argv):
        if word in known:
            sub = argv[i + 1] if i + 1 < len(argv) else ""
            return f"persysctl {word} {sub}" if word in GROUPS and _WORD.fullmatch(sub) else f"persysctl {word}"
    return "persysctl"


@contextmanager
def traced_command(argv: Sequence[str], known: Collection[str]) -> Iterator[None]:
    if not any(os.environ.get(v) for v in ENDPOINT_VARS):
        yield
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from persys.observability import tracing

    # A receiver that is down must not add lines to a command's output: its spans are dropped quietly.
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
    try:
        handle = tracing.setup_from(None, "persysctl", export_timeout=EXPORT_TIMEOUT)
    except tracing.TracingConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    _On.on = True
    try:
        with tracing.span(command_name(argv, known), kind=SpanKind.CLIENT, record=False) as s:
            try:
                yield
            except SystemExit as done:
                if done.code not in (0, None):
                    s.set_status(Status(StatusCode.ERROR, f"exit {done.code}"))
                raise
    finally:
        _On.on = False
        handle.shutdown()  # the batch is exported now: the process is about to end


def traceparent() -> str:
    """The traceparent header of the current command ('' when persysctl does not trace)."""
    if not _On.on:
        return ""
    from persys.observability import trace_context

    return trace_context.current()


def trace_id() -> str:
    """The trace id of the current command ('' when persysctl does not trace)."""
    parent = traceparent()
    return parent[3:35] if parent else ""
