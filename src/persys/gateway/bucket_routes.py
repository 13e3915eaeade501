"""REST routes of buckets on Ceph RGW: `GET|POST /v1/buckets`, `GET|DELETE /v1/buckets/{name}`,
and their keys, `GET|POST /v1/buckets/{name}/keys`, `DELETE /v1/buckets/{name}/keys/{key_id}`.
No answer carries a key's secret value: a key is answered with the name of its secret."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from persys.client import SchedulerClient
from persys.gateway import bodies
from persys.gateway.routes.common import bad_body
from persys.gateway.schemas import SCHEDULER_ERRORS, TOO_LARGE, json_body
from persys.model.documents import DocumentError, parse_document
from persys.model.kinds import validate_bucket
from persys.model.limits import GatewayLimits
from persys.model.manifest import ManifestError, format_validation_error

BucketName = Path(min_length=1, max_length=63, description="A bucket name (S3 rules; at most 49 characters, no '.')")
KeyId = Path(pattern=r"^[a-z0-9]{6}$", description="A key's id (6 lowercase letters or digits)")


class KeyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["read-only", "admin"] = Field(description="read-only: list and get objects; admin: also put "
                                                "and delete them")


BUCKET_BODY = json_body({"$ref": "#/components/schemas/BucketManifest"},
                        "A bucket manifest (`kind: Bucket`) as JSON (YAML is accepted too)")


def bucket_manifest(raw: bytes, limits: GatewayLimits) -> dict[str, Any]:
    """One `kind: Bucket` manifest, validated; returned as the plain document to forward."""
    try:
        doc = parse_document(raw, limits.max_depth) if raw.strip() else None
        if not isinstance(doc, dict):
            raise bodies.BodyError(["(document): expected one bucket manifest object"])
        validate_bucket(doc)
    except (DocumentError, ManifestError, ValidationError) as err:
        problems = (err.problems if isinstance(err, ManifestError)
                    else format_validation_error(err) if isinstance(err, ValidationError) else [str(err)])
        raise bodies.BodyError(problems) from None
    return doc


def bucket_router(client: SchedulerClient, parser: bodies.BodyParser) -> APIRouter:
    router = APIRouter(tags=["buckets"])

    @router.get("/v1/buckets", responses=SCHEDULER_ERRORS)
    async def list_buckets() -> list[dict[str, Any]]:
        """Every bucket's binding: owner, quota, keys (ids and roles), phase, the workloads using it."""
        return await client.list_buckets()

    @router.post("/v1/buckets", openapi_extra=BUCKET_BODY,
                 responses={201: {"description": "Created"}, **SCHEDULER_ERRORS, **TOO_LARGE})
    async def create_bucket(request: Request, dry_run: bool = Query(False, alias="dryRun")) -> JSONResponse:
        """Create a bucket on RGW (or change its quota); idempotent: a retry resumes an interrupted one."""
        try:
            doc = await parser.parse(bucket_manifest, await request.body())
        except bodies.BodyError as err:
            return bad_body(err)
        result = await client.create_bucket(doc, dry_run=dry_run)
        return JSONResponse(result, status_code=201 if result["created"] and not dry_run else 200)

    @router.get("/v1/buckets/{name}", responses=SCHEDULER_ERRORS)
    async def get_bucket(name: str = BucketName) -> dict[str, Any]:
        """The binding, with RGW's usage (objects, size)."""
        return await client.get_bucket(name)

    @router.delete("/v1/buckets/{name}", responses=SCHEDULER_ERRORS)
    async def delete_bucket(name: str = BucketName, purge: bool = Query(False, description="Delete its objects "
                                                                          "too (else refused while it holds any)")
                            ) -> dict[str, Any]:
        """Delete the bucket, its keys and their secrets; refused (409) while a workload references a key."""
        return await client.delete_bucket(name, purge)

    @router.get("/v1/buckets/{name}/keys", responses=SCHEDULER_ERRORS)
    async def list_keys(name: str = BucketName) -> list[dict[str, Any]]:
        """The bucket's keys: id, role, access key id and secret name (never the secret key)."""
        return await client.list_bucket_keys(name)

    @router.post("/v1/buckets/{name}/keys", status_code=201, responses=SCHEDULER_ERRORS)
    async def create_key(body: KeyBody, name: str = BucketName) -> dict[str, Any]:
        """A new key; its values go to the secret named in the answer (`secret`), for workloads'
        `spec.secrets` (env or files: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, S3_ENDPOINT, S3_BUCKET)."""
        return await client.create_bucket_key(name, body.role)

    @router.delete("/v1/buckets/{name}/keys/{key_id}", responses=SCHEDULER_ERRORS)
    async def delete_key(name: str = BucketName, key_id: str = KeyId) -> dict[str, Any]:
        """Delete the key in RGW and its secret; refused (409) while a workload references it."""
        return await client.delete_bucket_key(name, key_id)

    return router
