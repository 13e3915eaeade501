"""The Policy gRPC service: read and replace the cluster's workload policy.

Authorization is the interceptor's (security.permissions): `get policy` for viewers and up,
`update policy` for admins; every change is audited. Without the interceptor nothing is served.
"""

from __future__ import annotations

import grpc
from typing_extensions import override

from persys._pb.persys.v1 import policy_pb2 as pb
from persys._pb.persys.v1 import policy_pb2_grpc as pb_grpc
from persys.policy import WorkloadPolicy
from persys.scheduler.access.workload_policy import PolicyGate, parse_policy
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.rpc.authorization import CALLER
from persys.scheduler.rpc.status import mapped

POLICY_MAX_BYTES = 64 << 10


def _doc(policy: WorkloadPolicy, stored: bool) -> pb.PolicyDocument:
    return pb.PolicyDocument(policy_json=policy.model_dump_json(by_alias=True).encode(), stored=stored)


class PolicyService(pb_grpc.PolicyServicer):
    def __init__(self, scheduler: Scheduler, gate: PolicyGate, require_identity: bool = True) -> None:
        self.s = scheduler
        self.gate = gate
        self.require_identity = require_identity

    async def _allow(self, context: grpc.aio.ServicerContext) -> None:
        if self.require_identity and CALLER.get(None) is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "policy calls need the authorization layer")

    @override
    async def GetPolicy(self, request: pb.GetPolicyRequest, context: grpc.aio.ServicerContext) -> pb.PolicyDocument:
        await self._allow(context)
        async with mapped(context):
            return _doc(*await self.gate.current())

    @override
    async def SetPolicy(self, request: pb.SetPolicyRequest, context: grpc.aio.ServicerContext) -> pb.PolicyDocument:
        await self._allow(context)
        if len(request.policy_json) > POLICY_MAX_BYTES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"policy_json: {len(request.policy_json)} bytes exceeds {POLICY_MAX_BYTES}")
        async with mapped(context):  # a ManifestError names each problem
            policy = parse_policy(request.policy_json)
        if self.s.mode != "normal":
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"control plane is {self.s.mode}; the policy cannot be changed now")
        async with mapped(context):
            await self.gate.save(policy)
        self.s.emit("PolicyChanged", "cluster/policy", "workload policy replaced")
        return _doc(policy, True)
