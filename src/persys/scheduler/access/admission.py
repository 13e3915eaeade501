"""What the scheduler takes from clients, checked on sizes alone before anything is parsed.

A manifest's JSON is bounded (`MANIFEST_MAX_BYTES`, `persys scheduler --max-manifest-bytes`), so
is a batch (count and total bytes), so parsing, validating and storing a request costs at most
that much; a list answers a page at a time (`views/pages.py`). The gRPC server's receive limit is
derived from the same numbers, so anything it lets through reaches these checks and is refused
with the limit named, never half-parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from persys.model.limits import (
    BATCH_MAX_BYTES,
    BATCH_MAX_ITEMS,
    GRPC_MAX_MESSAGE_BYTES,
    MANIFEST_MAX_BYTES,
    human_bytes,
)

FRAMING_BYTES = 64 << 10  # protobuf framing around a batch's manifests


@dataclass(frozen=True, slots=True)
class InputLimits:
    max_manifest_bytes: int = MANIFEST_MAX_BYTES
    max_batch_bytes: int = BATCH_MAX_BYTES
    max_batch_items: int = BATCH_MAX_ITEMS

    @property
    def max_message_bytes(self) -> int:
        """The gRPC server's max_receive_message_length (a restore's backup is the largest request)."""
        return max(GRPC_MAX_MESSAGE_BYTES, self.max_batch_bytes + FRAMING_BYTES,
                   self.max_manifest_bytes + FRAMING_BYTES)

    def manifest_problem(self, raw: bytes, field: str = "manifest_json") -> str | None:
        if len(raw) > self.max_manifest_bytes:
            return (f"{field}: {len(raw)} bytes exceeds the manifest limit of {human_bytes(self.max_manifest_bytes)} "
                    f"({self.max_manifest_bytes} bytes, MANIFEST_MAX_BYTES)")
        return None

    def batch_problem(self, raws: Sequence[bytes]) -> str | None:
        if len(raws) > self.max_batch_items:
            return (f"manifests_json: {len(raws)} manifests exceeds the batch limit of {self.max_batch_items} "
                    f"manifests (BATCH_MAX_ITEMS)")
        for i, raw in enumerate(raws):
            problem = self.manifest_problem(raw, f"manifests_json[{i}]")
            if problem:
                return problem
        total = sum(len(r) for r in raws)
        if total > self.max_batch_bytes:
            return (f"manifests_json: {total} bytes exceeds the batch limit of {human_bytes(self.max_batch_bytes)} "
                    f"({self.max_batch_bytes} bytes, BATCH_MAX_BYTES)")
        return None
