"""REST routes of volume objects: `GET|POST /v1/volumes`, `GET|DELETE /v1/volumes/{name}`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from persys.client import SchedulerClient
from persys.gateway import bodies
from persys.gateway.routes.common import bad_body
from persys.gateway.schemas import SCHEDULER_ERRORS, TOO_LARGE, WORKLOAD_ID, json_body
from persys.model.documents import DocumentError, parse_document
from persys.model.kinds import validate_volume
from persys.model.limits import GatewayLimits
from persys.model.manifest import ManifestError, format_validation_error

VolumeName = Path(pattern=WORKLOAD_ID, max_length=63, description="A volume name (a DNS label)")
SnapshotName = Path(pattern=WORKLOAD_ID, max_length=63, description="A snapshot name (a DNS label)")


class SnapshotBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=WORKLOAD_ID, max_length=63, description="The snapshot's name (a DNS label)")


VOLUME_BODY = json_body({"$ref": "#/components/schemas/VolumeManifest"},
                        "A volume manifest (`kind: Volume`) as JSON (YAML is accepted too)")


def volume_manifest(raw: bytes, limits: GatewayLimits) -> dict[str, Any]:
    """One `kind: Volume` manifest, validated; returned as the plain document to forward."""
    try:
        doc = parse_document(raw, limits.max_depth) if raw.strip() else None
        if not isinstance(doc, dict):
            raise bodies.BodyError(["(document): expected one volume manifest object"])
        validate_volume(doc)
    except (DocumentError, ManifestError, ValidationError) as err:
        problems = (err.problems if isinstance(err, ManifestError)
                    else format_validation_error(err) if isinstance(err, ValidationError) else [str(err)])
        raise bodies.BodyError(problems) from None
    return doc


def volume_router(client: SchedulerClient, parser: bodies.BodyParser) -> APIRouter:
    router = APIRouter(tags=["volumes"])

    @router.get("/v1/volumes", responses=SCHEDULER_ERRORS)
    async def list_volumes() -> list[dict[str, Any]]:
        """Every volume: spec, phase, where its data is and the workloads that use it."""
        return await client.list_volumes()

    @router.post("/v1/volumes", openapi_extra=VOLUME_BODY,
                 responses={201: {"description": "Created"}, **SCHEDULER_ERRORS, **TOO_LARGE})
    async def apply_volume(request: Request, dry_run: bool = Query(False, alias="dryRun")) -> JSONResponse:
        """Create or update (grow, relabel) a volume; idempotent."""
        try:
            doc = await parser.parse(volume_manifest, await request.body())
        except bodies.BodyError as err:
            return bad_body(err)
        result = await client.apply_volume(doc, dry_run=dry_run)
        return JSONResponse(result, status_code=201 if result["created"] and not dry_run else 200)

    @router.get("/v1/volumes/{name}", responses=SCHEDULER_ERRORS)
    async def get_volume(name: str = VolumeName) -> dict[str, Any]:
        return await client.get_volume(name)

    @router.post("/v1/volumes/{name}/snapshots", responses=SCHEDULER_ERRORS)
    async def snapshot_volume(body: SnapshotBody, name: str = VolumeName) -> dict[str, Any]:
        """Ask for a snapshot of a network volume (`{"name": "<snapshot>"}`); idempotent. The
        volume's `snapshots` lists it once the backend has it."""
        return await client.snapshot_volume(name, body.name)

    @router.delete("/v1/volumes/{name}/snapshots/{snapshot}", responses=SCHEDULER_ERRORS)
    async def delete_snapshot(name: str = VolumeName, snapshot: str = SnapshotName) -> dict[str, Any]:
        return await client.snapshot_volume(name, snapshot, delete=True)

    @router.delete("/v1/volumes/{name}", responses=SCHEDULER_ERRORS)
    async def delete_volume(name: str = VolumeName) -> dict[str, Any]:
        """Delete a volume and its data; refused (409) while a workload uses it."""
        return await client.delete_volume(name)

    return router
