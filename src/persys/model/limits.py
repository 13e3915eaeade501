"""Bounds on what clients may send, shared by the gateway, the scheduler's gRPC service and persysctl.

One place, so a direct gRPC client meets the same limits as a REST client. The gateway's byte
limits can be changed with `persys gateway` options (`GatewayLimits`); the scheduler enforces
the defaults below, which the gateway's cannot usefully exceed.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bounds on what the placement engine consumes (it sums and compares quantities, and turns them
# into float scores): large enough for any real machine, small enough that no sum overflows.
MAX_QUANTITY = 2**40  # millicores, MiB

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# One manifest (a workload's JSON or YAML document).
MANIFEST_MAX_BYTES = 1 * MiB
# A bulk apply: every manifest together, and how many.
BATCH_MAX_BYTES = 16 * MiB
BATCH_MAX_ITEMS = 1000
# Other small JSON bodies (labels, taints).
SMALL_BODY_MAX_BYTES = 64 * KiB
# A backup sent to restore; also the largest gRPC message a scheduler or client accepts.
RESTORE_MAX_BYTES = 64 * MiB
GRPC_MAX_MESSAGE_BYTES = RESTORE_MAX_BYTES
# An image upload (streamed to disk on the node, never held in memory).
IMAGE_MAX_BYTES = 8 * GiB
# persysctl exec: the command's stdout and stderr together (the rest is dropped, and the answer
# says so), and its timeout in seconds (default and most).
EXEC_OUTPUT_MAX_BYTES = 4 * MiB
EXEC_STDIN_MAX_BYTES = 1 * MiB  # persysctl exec -i: what it reads is sent whole
EXEC_BODY_MAX_BYTES = 2 * MiB  # the exec request: argv and the stdin in base64 (4/3 of it)
EXEC_TIMEOUT_SECONDS = 60
EXEC_TIMEOUT_MAX_SECONDS = 3600
# persysctl cp: the tar archive of what is copied, either way (spooled to disk on the node).
COPY_MAX_BYTES = 64 * MiB
# Nesting of mappings and lists in any document; real manifests stay under 10.
MAX_DEPTH = 64


@dataclass(frozen=True)
class GatewayLimits:
    """The gateway's request-body limits in bytes (checked before anything is parsed)."""

    manifest_bytes: int = MANIFEST_MAX_BYTES
    batch_bytes: int = BATCH_MAX_BYTES
    batch_items: int = BATCH_MAX_ITEMS
    small_body_bytes: int = SMALL_BODY_MAX_BYTES
    restore_bytes: int = RESTORE_MAX_BYTES
    image_bytes: int = IMAGE_MAX_BYTES
    copy_bytes: int = COPY_MAX_BYTES
    max_depth: int = MAX_DEPTH
    # API requests answered at once; more are refused with 503 + Retry-After (gateway.shedding).
    max_in_flight: int = 64
    # TLS connections open or handshaking at once; more are refused at their ClientHello with a
    # TLS alert, before the handshake's costly part (gateway.tls_gate).
    max_connections: int = 1024
    # An API read (GET) is answered within this many seconds: its data, or 503 + Retry-After when
    # the scheduler cannot give it in time (gateway.read_budget); 0 (the default): no budget. Off
    # by default: with it on, a storm of 1,000 lists left the gateway's RSS ~80 MiB above its
    # baseline (docs/benchmarks.md, "Overloaded scheduler"), which the storm test refuses.
    read_budget_s: float = 0.0
    # API reads asking the scheduler at once from the gateway; more wait (bounded) or are shed
    # with 503 + Retry-After (gateway.scheduler_gate).
    max_scheduler_calls: int = 2


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"
