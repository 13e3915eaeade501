"""A stored workload document the model refuses, as the mirror keeps it (see quarantine)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from persys.model import Phase, WorkloadStatus


class RefusedWorkload(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    problems: tuple[str, ...]
    doc: dict[str, Any] | None  # the stored document, when it is a JSON object

    @property
    def deleting(self) -> bool:
        return bool(self.doc and self.doc.get("deleting") is True)

    @property
    def message(self) -> str:
        return "stored workload refused by the model: " + "; ".join(self.problems)

    def spec_json(self) -> bytes | None:
        """The stored spec as it is, for agents already running this workload."""
        spec = self.doc.get("spec") if self.doc else None
        return json.dumps(spec).encode() if isinstance(spec, dict) else None


INVALID_SPEC = "InvalidSpec"


def refused_status(prev: WorkloadStatus | None, r: RefusedWorkload, now: float) -> WorkloadStatus | None:
    """The status of an unplaced instance of a refused workload, or None if `prev` says it."""
    if prev is not None and (prev.phase, prev.reason, prev.message) == (Phase.FAILED, INVALID_SPEC, r.message):
        return None
    return WorkloadStatus(phase=Phase.FAILED, reason=INVALID_SPEC, message=r.message,
                          volume_node=prev.volume_node if prev else "", updated_at=now)
