"""What every route module shares: path parameters and the 400 answer to a bad body."""

from __future__ import annotations

from fastapi import Path
from fastapi.responses import JSONResponse

from persys.gateway import bodies
from persys.gateway.schemas import WORKLOAD_ID

NodeId = Path(min_length=1, max_length=253)
WorkloadId = Path(pattern=WORKLOAD_ID)


def bad_body(err: bodies.BodyError) -> JSONResponse:
    return JSONResponse({"error": str(err), "problems": err.problems}, status_code=400)
