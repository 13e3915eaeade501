"""REST routes of the NodeAccess service: node join tokens (/v1/join-tokens) and node
revocation (/v1/nodes/{id}/revoke). Admins only (the authorization middleware checks, the
scheduler checks again and audits)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from persys.client import SchedulerClient
from persys.gateway.schemas import SCHEDULER_ERRORS
from persys.security.join_tokens import MAX_DESCRIPTION, MAX_TTL, MIN_TTL

NODE_ID = r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$"


class JoinTokenRequest(BaseModel):
    """A single-use token that lets one node join (`persys agent --join ... --token ...`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    ttl_seconds: float = Field(3600.0, alias="ttlSeconds", ge=MIN_TTL, le=MAX_TTL, allow_inf_nan=False,
                               description="from 60 (1 minute) to 604800 (7 days)")
    node_id: str = Field("", alias="nodeId", max_length=63,
                         description="the only node it admits; empty: the joining node names a new id")
    description: str = Field("", max_length=MAX_DESCRIPTION)


class RevokeNodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field("", max_length=256)
    force: bool = Field(False, description="revoke an id no node has (never registered, no certificate, no "
                        "join token); without it such an id is a 404, as a typo would be")


def join_router(client: SchedulerClient) -> APIRouter:
    router = APIRouter(tags=["nodes"], responses=SCHEDULER_ERRORS)

    @router.post("/v1/join-tokens", status_code=201)
    async def create_join_token(body: JoinTokenRequest) -> dict[str, Any]:
        """Create a node join token. The answer's `token` is the secret (shown this once, stored
        hashed) and `caPin` the hash of the CA the joining node must find."""
        return await client.create_join_token(body.ttl_seconds, body.node_id, body.description)

    @router.get("/v1/join-tokens")
    async def list_join_tokens() -> list[dict[str, Any]]:
        """Every join token's record (never its secret): expiry, node, state (active, used, expired, revoked)."""
        return await client.list_join_tokens()

    @router.delete("/v1/join-tokens/{token_id}")
    async def revoke_join_token(token_id: str = Path(pattern=r"^[a-z0-9]{6}$")) -> dict[str, Any]:
        """Revoke an unused join token."""
        return await client.revoke_join_token(token_id)

    @router.post("/v1/nodes/{node_id}/revoke")
    async def revoke_node(body: RevokeNodeRequest, node_id: str = Path(pattern=NODE_ID)) -> dict[str, Any]:
        """Revoke a node's identity: every scheduler replica refuses its calls and ends its streams
        (within a second on other replicas, plus a heartbeat interval for its update stream); its
        certificate is never renewed."""
        return await client.revoke_node(node_id, body.reason, body.force)

    return router
