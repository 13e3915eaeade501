"""REST routes of secrets: `GET /v1/secrets` (names and versions; keys for who may get them),
`GET|PUT|DELETE /v1/secrets/{name}`. No answer carries a value, and a refused body is named by
its fields only (never echoed: pydantic's own 422 would quote the input)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError

from persys.client import SchedulerClient, SchedulerError
from persys.gateway.schemas import SCHEDULER_ERRORS, TOO_LARGE
from persys.model.documents import DocumentError, parse_document
from persys.model.manifest import ManifestError
from persys.model.secret import SecretData, validate_secret
from persys.model.secret_refs import MAX_SECRET_BYTES

# A secret's values in base64 (4/3) with keys and framing: the body bound of a PUT.
SECRET_BODY_MAX_BYTES = MAX_SECRET_BYTES * 2


def secret_values(raw: bytes) -> dict[str, bytes]:
    """The values of a PUT body ({"data": base64, "stringData": text}); SchedulerError
    INVALID_ARGUMENT naming the field otherwise."""
    try:
        doc = parse_document(raw, 8) if raw.strip() else None
        if not isinstance(doc, dict):
            raise ManifestError(["(document): expected an object with data or stringData"])
        return validate_secret(doc, model=SecretData).values()
    except (DocumentError, ManifestError, ValidationError, ValueError, json.JSONDecodeError) as err:
        problems = err.problems if isinstance(err, ManifestError) else [str(err).split("\n")[0][:200]]
        raise SchedulerError("INVALID_ARGUMENT", "; ".join(problems)) from None


def secret_router(client: SchedulerClient) -> APIRouter:
    router = APIRouter(tags=["secrets"])

    @router.get("/v1/secrets", responses=SCHEDULER_ERRORS)
    async def list_secrets() -> list[dict[str, Any]]:
        """Secrets by name with version and times; their key names for callers who may get secrets."""
        return await client.list_secrets()

    @router.get("/v1/secrets/{name}", responses=SCHEDULER_ERRORS)
    async def get_secret(name: str) -> dict[str, Any]:
        """One secret's keys, version, times and the workloads that use it; never its values."""
        return await client.get_secret(name)

    @router.put("/v1/secrets/{name}", responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def put_secret(name: str, request: Request) -> dict[str, Any]:
        """Create or replace a secret: body `{"data": {key: base64}, "stringData": {key: text}}`.
        Workloads using it restart with the new version unless they set rollOnChange: false."""
        values = secret_values(await request.body())
        return await client.put_secret(name, values)

    @router.delete("/v1/secrets/{name}", responses=SCHEDULER_ERRORS)
    async def delete_secret(name: str) -> dict[str, Any]:
        """Delete a secret (every version). Workloads still using it report it when they next start."""
        return {"deleted": await client.delete_secret(name)}

    return router
