"""REST routes of automation (docs/automation.md):

    GET|POST /v1/automation/policies             every policy (and the cluster-wide pause); apply one
    GET|DELETE /v1/automation/policies/{name}
    GET /v1/automation/policies/{name}/replay    ?since=7d: the policy's decision over past meter data
    GET /v1/automation/decisions                 ?policy=&since=&limit=&outcome=: the decision log
    POST /v1/automation/pause, /resume           ?policy= (none: all automation), body {"reason"}
"""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from persys.automation.replay_run import ReplayRefused, replay_policy
from persys.client import SchedulerClient
from persys.gateway import bodies
from persys.gateway.routes.common import bad_body
from persys.gateway.schemas import SCHEDULER_ERRORS, TOO_LARGE, json_body
from persys.meter.query import QueryError, seconds
from persys.model.automation import validate_policy
from persys.model.documents import DocumentError, parse_document
from persys.model.limits import GatewayLimits
from persys.model.manifest import ManifestError, format_validation_error

PolicyName = Path(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
                  description="A policy's name (a DNS label)")
POLICY_BODY = json_body({"$ref": "#/components/schemas/PolicyManifest"},
                        "A policy manifest (`kind: Policy`) as JSON (YAML is accepted too)")


class PauseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field("", max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$",
                        description="Why (kept with the switch and in the event)")


def _bad(field: str, message: str) -> JSONResponse:
    text = f"{field}: {message}"
    return JSONResponse({"error": text, "code": "INVALID_ARGUMENT", "problems": [text]}, status_code=400)


def policy_manifest(raw: bytes, limits: GatewayLimits) -> dict[str, Any]:
    try:
        doc = parse_document(raw, limits.max_depth) if raw.strip() else None
        if not isinstance(doc, dict):
            raise bodies.BodyError(["(document): expected one policy manifest object"])
        validate_policy(doc)
    except (DocumentError, ManifestError, ValidationError) as err:
        problems = (err.problems if isinstance(err, ManifestError)
                    else format_validation_error(err) if isinstance(err, ValidationError) else [str(err)])
        raise bodies.BodyError(problems) from None
    return doc


def automation_router(client: SchedulerClient, parser: bodies.BodyParser) -> APIRouter:
    router = APIRouter(tags=["automation"])

    @router.get("/v1/automation/policies", responses=SCHEDULER_ERRORS)
    async def list_policies() -> dict[str, Any]:
        """`{"items": [policy...], "pause": {"paused", "by", "at", "reason"}}`."""
        return await client.list_automation_policies()

    @router.post("/v1/automation/policies", openapi_extra=POLICY_BODY,
                 responses={201: {"description": "Created"}, **SCHEDULER_ERRORS, **TOO_LARGE})
    async def apply_policy(request: Request, dry_run: bool = Query(False, alias="dryRun")) -> JSONResponse:
        """Create or replace a policy (operators and admins); its version grows when its spec changes."""
        try:
            doc = await parser.parse(policy_manifest, await request.body())
        except bodies.BodyError as err:
            return bad_body(err)
        result = await client.apply_automation_policy(doc, dry_run=dry_run)
        return JSONResponse(result, status_code=201 if result["created"] and not dry_run else 200)

    @router.get("/v1/automation/policies/{name}", responses=SCHEDULER_ERRORS)
    async def get_policy(name: str = PolicyName) -> dict[str, Any]:
        return await client.get_automation_policy(name)

    @router.delete("/v1/automation/policies/{name}", responses=SCHEDULER_ERRORS)
    async def delete_policy(name: str = PolicyName) -> dict[str, Any]:
        return await client.delete_automation_policy(name)

    _log_routes(router, client)
    return router


def _log_routes(router: APIRouter, client: SchedulerClient) -> None:
    """Replay, the decision log and the off switch."""

    @router.get("/v1/automation/policies/{name}/replay", responses=SCHEDULER_ERRORS)
    async def replay(name: str = PolicyName, since: str = Query("7d", max_length=16),
                     start_replicas: int = Query(0, alias="startReplicas", ge=0, le=10_000)) -> Any:
        """The policy's pure decision over the meter's history of its workload: actions per hour,
        flaps, time over target, and every action it would have taken (autoscale policies)."""
        try:
            window = seconds(since, "since")
        except QueryError as err:
            return _bad("since", str(err).removeprefix("since: "))
        try:
            return await replay_policy(client, name, window, time.time(), start_replicas or None)
        except ReplayRefused as err:
            return _bad(err.field, str(err))

    @router.get("/v1/automation/decisions", responses=SCHEDULER_ERRORS)
    async def decisions(policy: str = Query("", max_length=63, pattern=r"^$|^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"),
                        since: str = Query("", max_length=16, description="A duration (1h) back from now"),
                        limit: int = Query(100, ge=1, le=5000),
                        outcome: Literal["", "acted", "dry-run", "none", "paused", "failed"] = "") -> Any:
        """The newest `limit` decisions (of one policy, or all), oldest first."""
        start = 0.0
        if since:
            try:
                start = time.time() - seconds(since, "since")
            except QueryError as err:
                return _bad("since", str(err).removeprefix("since: "))
        return await client.list_decisions(policy, start, limit, outcome)

    async def pause(paused: bool, policy: str, body: PauseBody | None) -> dict[str, Any]:
        return await client.set_automation_pause(policy, paused, body.reason if body else "")

    @router.post("/v1/automation/pause", responses=SCHEDULER_ERRORS)
    async def pause_route(body: PauseBody | None = None, policy: str = Query(
            "", max_length=63, pattern=r"^$|^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")) -> dict[str, Any]:
        """Pause one policy (`policy`) or all automation: nothing is decided or done until resumed."""
        return await pause(True, policy, body)

    @router.post("/v1/automation/resume", responses=SCHEDULER_ERRORS)
    async def resume_route(body: PauseBody | None = None, policy: str = Query(
            "", max_length=63, pattern=r"^$|^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")) -> dict[str, Any]:
        return await pause(False, policy, body)
