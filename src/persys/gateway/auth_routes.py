"""REST routes of the Auth service: /v1/auth/... (who am I, can I, API tokens) and /v1/audit.

Each maps onto one Auth call; the authorization middleware has checked the caller already and
the scheduler checks again.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from persys.client import SchedulerClient
from persys.gateway.schemas import SCHEDULER_ERRORS
from persys.security.tokens import MAX_TTL

TOKEN_ID = r"^[0-9a-f]{16}$"


class TokenRequest(BaseModel):
    """A new API token acting as `user:<name>` with `role`."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._@-]{0,62}$")
    role: str = Field(pattern="^(admin|operator|viewer)$")
    ttl_seconds: float = Field(0, alias="ttlSeconds", ge=0, le=MAX_TTL, allow_inf_nan=False,
                               description="0: 30 days")
    description: str = Field("", max_length=256)


def auth_router(client: SchedulerClient) -> APIRouter:
    router = APIRouter(tags=["auth"], responses=SCHEDULER_ERRORS)

    @router.get("/v1/auth/whoami")
    async def whoami() -> dict[str, Any]:
        """The caller's identity as the scheduler sees it: principal, groups, roles, credential."""
        return await client.whoami()

    @router.get("/v1/auth/can-i")
    async def can_i(verb: str = Query(max_length=64), resource: str = Query(max_length=64)) -> dict[str, Any]:
        """Whether the caller may perform `verb` on `resource` (e.g. `apply workloads`)."""
        return await client.can_i(verb, resource)

    @router.post("/v1/auth/tokens", status_code=201)
    async def create_token(body: TokenRequest) -> dict[str, Any]:
        """Create an API token. The answer's `token` is the secret: shown this once, stored hashed."""
        return await client.create_token(body.name, body.role, body.ttl_seconds, body.description)

    @router.get("/v1/auth/tokens")
    async def list_tokens() -> list[dict[str, Any]]:
        """Every token's record (never its secret): user, role, expiry, state."""
        return await client.list_tokens()

    @router.delete("/v1/auth/tokens/{token_id}")
    async def revoke_token(token_id: str = Path(pattern=TOKEN_ID)) -> dict[str, Any]:
        """Revoke a token: refused from then on, by every replica."""
        return await client.revoke_token(token_id)

    @router.get("/v1/audit")
    async def audit(since: float = Query(0, ge=0, allow_inf_nan=False), who: str = Query("", max_length=253),
                    limit: int = Query(100, ge=1, le=10_000)) -> dict[str, Any]:
        """Audit records, oldest first: the newest `limit` since `since` (unix seconds) whose
        principal (or gateway) contains `who`. `kept` is how many records the log keeps."""
        return await client.audit(since, who, limit)

    return router
