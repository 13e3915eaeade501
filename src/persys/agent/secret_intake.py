"""Getting an instance's secret values just before it starts: asked from the scheduler over the
link (SecretDelivery, authorized for this node's own instances), held in memory for the start
only. Nothing here is written to agent.db or logged."""

from __future__ import annotations

from typing import Protocol

import grpc

from persys._pb.persys.v1 import secrets_pb2 as spb
from persys.agent.runtimes.base import RuntimeFailure, SecretMaterial
from persys.model import WorkloadSpec

# Answers that will not change by asking again for the same revision: a secret or key gone
# (a new version of the secret rolls the workload, which asks again), or the instance not ours.
TERMINAL = frozenset({grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
                      grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT})


class SecretSource(Protocol):
    async def resolve_secrets(self, instance_id: str) -> spb.ResolveSecretsResponse: ...


async def fetch_secrets(source: SecretSource, instance_id: str, spec: WorkloadSpec) -> SecretMaterial:
    """The instance's secret material (empty without references); RuntimeFailure with code
    SecretUnavailable naming the secret when it cannot be had."""
    if spec.secrets is None or not spec.secrets.refs():
        return SecretMaterial()
    try:
        r = await source.resolve_secrets(instance_id)
    except grpc.aio.AioRpcError as err:
        code = err.code()
        raise RuntimeFailure(f"secrets: {(err.details() or code.name)[:300]}", code="SecretUnavailable",
                             terminal=code in TERMINAL) from None
    return SecretMaterial(env=dict(r.env), files=dict(r.files), registry_auth=dict(r.registry_auth))
