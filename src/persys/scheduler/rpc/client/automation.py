"""The Automation gRPC service (proto/persys/v1/automation.proto): policies, the pause switch and
the decision log, authorized by the interceptor (security.permissions: reads for viewers, the
rest for operators and admins). Policy changes and pauses are audited; decision records are the
automation's own log (each names the identity that recorded it)."""

from __future__ import annotations

import grpc

from persys._pb.persys.v1 import automation_pb2 as pb
from persys._pb.persys.v1 import automation_pb2_grpc as pb_grpc
from persys.model.automation import policy_name_problem, validate_policy
from persys.model.documents import DocumentError, load_json
from persys.model.manifest import ManifestError
from persys.scheduler.access.admission import InputLimits
from persys.scheduler.api.automation import AutomationApi
from persys.scheduler.api.automation_lease import AutomationLease
from persys.scheduler.rpc.authorization import CALLER
from persys.scheduler.rpc.status import dumps, mapped


def _caller() -> str:
    c = CALLER.get(None)
    return c.identity.principal if c is not None else "unknown"


class AutomationService(pb_grpc.AutomationServicer):
    def __init__(self, api: AutomationApi, limits: InputLimits | None = None) -> None:
        self.api = api
        self.limits = limits or InputLimits()
        self.lease = AutomationLease(api.s)

    async def _name(self, context: grpc.aio.ServicerContext, name: str, field: str = "name") -> None:
        problem = policy_name_problem(name)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {problem}")

    async def _listing(self) -> pb.ListAutomationPoliciesResponse:
        return pb.ListAutomationPoliciesResponse(items=[dumps(p.view()) for p in await self.api.list_all()],
                                                 pause_json=dumps(await self.api.pause_state()))

    async def ApplyAutomationPolicy(self, request: pb.ApplyAutomationPolicyRequest,  # noqa: N802
                                    context: grpc.aio.ServicerContext) -> pb.AutomationPolicyAnswer:
        problem = self.limits.manifest_problem(request.manifest_json)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        async with mapped(context):
            try:
                doc = load_json(request.manifest_json)
            except DocumentError as err:
                raise ManifestError([str(err)]) from None
            p, created, changed = await self.api.apply(validate_policy(doc), _caller(), request.dry_run)
            return pb.AutomationPolicyAnswer(policy_json=dumps(p.view()), created=created, changed=changed)

    async def GetAutomationPolicy(self, request: pb.AutomationPolicyName,  # noqa: N802
                                  context: grpc.aio.ServicerContext) -> pb.AutomationPolicyAnswer:
        await self._name(context, request.name)
        async with mapped(context):
            return pb.AutomationPolicyAnswer(policy_json=dumps((await self.api.get(request.name)).view()))

    async def ListAutomationPolicies(self, request: pb.ListAutomationPoliciesRequest,  # noqa: N802
                                     context: grpc.aio.ServicerContext) -> pb.ListAutomationPoliciesResponse:
        async with mapped(context):
            return await self._listing()

    async def DeleteAutomationPolicy(self, request: pb.AutomationPolicyName,  # noqa: N802
                                     context: grpc.aio.ServicerContext) -> pb.DeleteAutomationPolicyResponse:
        await self._name(context, request.name)
        async with mapped(context):
            deleted, gone = await self.api.delete(request.name)
            return pb.DeleteAutomationPolicyResponse(deleted=deleted, already_gone=gone)

    async def SetAutomationPause(self, request: pb.SetAutomationPauseRequest,  # noqa: N802
                                 context: grpc.aio.ServicerContext) -> pb.ListAutomationPoliciesResponse:
        if request.policy:
            await self._name(context, request.policy, "policy")
        if len(request.reason) > 200 or not request.reason.isprintable():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "reason: at most 200 printable characters")
        async with mapped(context):
            await self.api.set_pause(request.policy, request.paused, _caller(), request.reason)
            return await self._listing()

    async def RecordDecisions(self, request: pb.RecordDecisionsRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext) -> pb.RecordDecisionsResponse:
        for i, raw in enumerate(request.decisions):
            problem = self.limits.manifest_problem(raw, f"decisions[{i}]")
            if problem:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        async with mapped(context):
            return pb.RecordDecisionsResponse(ids=await self.api.record(list(request.decisions), _caller()))

    async def ListDecisions(self, request: pb.ListDecisionsRequest,  # noqa: N802
                            context: grpc.aio.ServicerContext) -> pb.ListDecisionsResponse:
        if request.policy:
            await self._name(context, request.policy, "policy")
        async with mapped(context):
            items = await self.api.list_decisions(request.policy, request.since, request.limit, request.outcome)
            return pb.ListDecisionsResponse(items=[dumps(d) for d in items])

    async def AutomationLease(self, request: pb.AutomationLeaseRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext) -> pb.AutomationLeaseResponse:
        async with mapped(context):
            r = await self.lease.ask(request.holder, request.ttl_seconds, request.release, _caller())
            return pb.AutomationLeaseResponse(held=r["held"], holder=r["holder"], acquired_at=r["acquiredAt"],
                                              term=r["term"])
