"""What every route module shares: path parameters and the 400 answer to a bad body."""

from __future__ import annotations

from fastapi import Path
from fastapi.responses import JSONResponse

from persys.gateway import bodies
from persys.gateway.schemas import WORKLOAD_ID

NodeId = Path(min_length=1, max_length=253)
WorkloadId = Path(pattern=WORKLOAD_ID)
# The scheduler's gRPC status codes as HTTP statuses.
HTTP_STATUS: dict[str, int] = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "ABORTED": 409,
    "FAILED_PRECONDITION": 409,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
    "RESOURCE_EXHAUSTED": 413,
    "OUT_OF_RANGE": 410,  # a revision compacted away (explain --at)
}


def bad_body(err: bodies.BodyError) -> JSONResponse:
    return JSONResponse({"error": str(err), "problems": err.problems}, status_code=400)
