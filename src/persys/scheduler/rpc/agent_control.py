"""The AgentControl gRPC service: a thin translation between protobuf and the Scheduler.

Authorization is by certificate identity: only an agent's `node:<id>` certificate speaks for node
`<id>`, and what it reports is validated and bounded first (`node_admission`, `call_budget`).
Client calls are authorized by roles in scheduler.authorization first.
Scheduler exceptions become gRPC status codes in one place (`grpc_status.mapped`), which the gateway turns
into HTTP statuses and persysctl into one line of text.

Just over 500 lines: one servicer per proto service, and node admission, call budgets and
revocation checks must sit on each of its five streaming/unary node calls.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from pydantic import ValidationError

from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.aborting import aborting
from persys.model import (
    Capabilities,
    DesiredState,
    Node,
    NodeUsage,
    Phase,
    RuntimeInfo,
    Taint,
    WorkloadManifest,
    WorkloadUsage,
)
from persys.model.devices import Device
from persys.model.documents import DocumentError, load_json
from persys.model.manifest import ManifestError, format_validation_error, validate_manifest
from persys.observability import tracing
from persys.scheduler.access import node_admission
from persys.scheduler.access.admission import InputLimits
from persys.scheduler.access.call_budget import (
    CALLS_PER_NODE,
    UPDATE_STREAMS_PER_NODE,
    WATCH_STREAMS_PER_NODE,
    CallBudget,
    OverBudgetError,
)
from persys.scheduler.access.node_admission import unavailable_runtimes
from persys.scheduler.access.revocations import NodeRevocations, NodeRevokedError
from persys.scheduler.access.workload_policy import PolicyGate
from persys.scheduler.api import replay
from persys.scheduler.api.node_volumes import VolumeReport
from persys.scheduler.errors import NotFound
from persys.scheduler.mirror.follower import ClusterState
from persys.scheduler.mirror.reports import WorkloadReport
from persys.scheduler.placing import whatif as whatif_api
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.rpc.authorization import CALLER
from persys.scheduler.rpc.status import UNAVAILABLE_METADATA, dumps, mapped
from persys.scheduler.rules import revisions
from persys.scheduler.rules import volumes as volume_rules
from persys.scheduler.views.pages import MAX_EVENTS, BadPageRequest, Page, decode_token, encode_token, page_limit
from persys.scheduler.work import instance_move
from persys.scheduler.work.report_queue import ReportQueue
from persys.security.identity import Identity, Kind
from persys.security.peer import peer_hosts, peer_identity_of

log = logging.getLogger(__name__)

STATE_TO_PHASE = {
    pb.WORKLOAD_STATE_PENDING: Phase.SCHEDULED,
    pb.WORKLOAD_STATE_RUNNING: Phase.RUNNING,
    pb.WORKLOAD_STATE_STOPPED: Phase.STOPPED,
    pb.WORKLOAD_STATE_FAILED: Phase.FAILED,
    pb.WORKLOAD_STATE_MISSING: Phase.SCHEDULED,
}


def _liveness_pb(doc: dict[str, Any]) -> pb.LivenessGuard:
    return pb.LivenessGuard(suspended=doc["suspended"], since=doc["since"], ends_at=doc["endsAt"], reason=doc["reason"],
                            silent_nodes=doc["silentNodes"], judged_nodes=doc["judgedNodes"])


async def _refuse(context: grpc.aio.ServicerContext, refusal: node_admission.Refusal) -> None:
    await context.abort(grpc.StatusCode[refusal.code.value], str(refusal))


async def _mapped_error(context: grpc.aio.ServicerContext, err: Exception) -> NoReturn:
    """End the call with `err`'s status, as `mapped` would have (built only when one happens)."""
    async with mapped(context):
        raise err



def given_devices(state: ClusterState, node_id: str, instance: str) -> list[str]:
    """The node's devices (GPUs) the instance's assignment there was given."""
    a = state.assignments.get(node_id, {}).get(instance)
    return list(a.value.devices or ()) if a is not None else []

class AgentControlService(pb_grpc.AgentControlServicer):
    def __init__(self, scheduler: Scheduler, require_identity: bool = True, limits: InputLimits | None = None,
                 policy: PolicyGate | None = None, node_simulators: frozenset[str] = frozenset(),
                 revocations: NodeRevocations | None = None) -> None:
        self.s = scheduler
        # The components the calls go to, by name (not the replica's re-exports of their methods):
        # "go to definition" from a call below lands on the method that does the work.
        self.workloads = scheduler.workload_api
        self.agents = scheduler.agent_api
        self.nodes = scheduler.node_api
        self.backups = scheduler.backups
        self.node_volumes = scheduler.node_volumes
        self.revocations = revocations  # revoked node identities (none: unit tests without them)
        self.require_identity = require_identity
        self.limits = limits or InputLimits()
        self.policy = policy or PolicyGate(scheduler.store)  # the workload policy, checked at admission
        # Principals (e.g. `user:admin`) that may act for any node: benchmarks' hollow agents only.
        self.node_simulators = node_simulators
        self.watch_budget = CallBudget(WATCH_STREAMS_PER_NODE, "desired-state watches")
        self.update_budget = CallBudget(UPDATE_STREAMS_PER_NODE, "update streams")
        self.call_budget = CallBudget(CALLS_PER_NODE, "calls in progress")

    # ---------------------------------------------------------------- authorization

    async def _as_node(self, node_id: str, context: grpc.aio.ServicerContext) -> None:
        async with mapped(context):
            self.s.require_owner(node_id)  # the active replica, or in sharded mode the node's owner
        # Without TLS (unit tests) the caller is taken to be the node; its id is checked all the same.
        caller = peer_identity_of(context) if self.require_identity else Identity(Kind.NODE, node_id)
        refusal = node_admission.caller_refusal(caller, node_id, self.node_simulators)
        if refusal:
            await _refuse(context, refusal)
        await self._not_revoked(node_id, context)

    async def _not_revoked(self, node_id: str, context: grpc.aio.ServicerContext) -> None:
        if self.revocations is not None and self.revocations.is_revoked(node_id):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(NodeRevokedError(node_id)))

    @aborting
    @contextlib.asynccontextmanager
    async def _budget(self, budget: CallBudget, node_id: str, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[None]:
        try:
            budget.acquire(node_id)
        except OverBudgetError as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        try:
            yield
        finally:
            budget.release(node_id)

    async def _as_client(self, context: grpc.aio.ServicerContext) -> None:
        # Roles are checked by the authorization interceptor before a client method runs; without
        # it (a server set up otherwise) no client call is served.
        if self.require_identity and CALLER.get(None) is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "client operations need the authorization layer")

    async def _document(self, context: grpc.aio.ServicerContext, make: Callable[[], Awaitable[Any]]) -> pb.Document:
        """A client call whose answer is one JSON document."""
        await self._as_client(context)
        async with mapped(context):
            return pb.Document(json=dumps(await make()))

    # ---------------------------------------------------------------- agent side

    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: grpc.aio.ServicerContext
                           ) -> pb.RegisterNodeResponse:
        await self._as_node(request.node_id, context)
        async with self._budget(self.call_budget, request.node_id, context):
            return await self._register(request, context)

    async def _register(self, request: pb.RegisterNodeRequest, context: grpc.aio.ServicerContext
                        ) -> pb.RegisterNodeResponse:
        caps = request.capabilities
        refusal = node_admission.registration_refusal(self._claim(request, context))
        if refusal:  # before anything is written
            await _refuse(context, refusal)
        async with mapped(context):
            node = Node(
                id=request.node_id,
                address=request.address,
                agent_version=request.agent_version,
                capabilities=Capabilities(
                    runtimes={r.workload_type: RuntimeInfo(version=r.version, features=list(r.features))
                              for r in caps.runtimes},
                    storage_drivers=list(caps.storage_drivers),
                    storage_missing=unavailable_runtimes(caps.storage_missing),
                    cpu_millicores=caps.cpu_millicores,
                    memory_mb=caps.memory_mb,
                    disk_mb=caps.disk_mb,
                    unavailable=unavailable_runtimes(caps.unavailable_runtimes),
                    devices=[Device(id=d.id, vendor=d.vendor, model=d.model, memory_mb=d.memory_mb, index=d.index)
                             for d in caps.devices],
                ),
                labels=dict(request.labels),
                taints=[Taint.model_validate({"key": t.key, "value": t.value, "effect": t.effect or "NoSchedule"})
                        for t in request.taints],
            )
            await self.agents.register(node)
        cfg = self.s.config
        return pb.RegisterNodeResponse(accepted=True, heartbeat_interval_seconds=cfg.heartbeat_interval_seconds,
                                       report_interval_seconds=cfg.report_interval_seconds,
                                       node_grace_seconds=cfg.node_grace_seconds)

    def _claim(self, request: pb.RegisterNodeRequest, context: grpc.aio.ServicerContext) -> node_admission.NodeClaim:
        caps = request.capabilities
        caller = peer_identity_of(context) if self.require_identity else Identity(Kind.NODE, request.node_id)
        return node_admission.NodeClaim(
            node_id=request.node_id, address=request.address, agent_version=request.agent_version,
            cpu_millicores=caps.cpu_millicores, memory_mb=caps.memory_mb, disk_mb=caps.disk_mb,
            labels=dict(request.labels),
            taints=tuple(node_admission.TaintClaim(t.key, t.value, t.effect or "NoSchedule") for t in request.taints),
            runtimes=tuple(node_admission.RuntimeClaim(r.workload_type, r.version, tuple(r.features))
                           for r in caps.runtimes),
            storage_drivers=tuple(caps.storage_drivers),
            cert_hosts=peer_hosts(context) if self.require_identity else frozenset(),
            simulated=caller.principal in self.node_simulators or not self.require_identity,
        )

    @staticmethod
    def _usage_refusal(request: pb.HeartbeatRequest) -> node_admission.Refusal | None:
        u = request.usage
        return node_admission.usage_refusal(u.cpu_percent, u.memory_used_mb, u.disk_used_mb, u.workloads,
                                            (u.disk_read_bytes, u.disk_write_bytes, u.net_rx_bytes, u.net_tx_bytes))

    async def _check_usage(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> None:
        if refusal := self._usage_refusal(request):
            await _refuse(context, refusal)

    def _heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        u = request.usage
        known = self.agents.heartbeat(request.node_id, NodeUsage(
            cpu_percent=u.cpu_percent, memory_used_mb=u.memory_used_mb, disk_used_mb=u.disk_used_mb,
            workloads=u.workloads, disk_read_bytes=u.disk_read_bytes, disk_write_bytes=u.disk_write_bytes,
            net_rx_bytes=u.net_rx_bytes, net_tx_bytes=u.net_tx_bytes))
        return pb.HeartbeatResponse(acknowledged=known, reregister=not known, mode=self.s.mode,
                                    node_grace_seconds=self.s.config.node_grace_seconds,
                                    volume_tasks=self.node_volumes.tasks(request.node_id) if known else ())

    async def _report(self, request: pb.ReportStatusRequest) -> None:
        reports = [
            WorkloadReport(
                workload_id=r.instance_id, revision=r.revision, generation=r.generation,
                phase=STATE_TO_PHASE.get(r.state, Phase.SCHEDULED), reason=r.reason, message=r.message,
                terminal=r.terminal, runtime_id=r.runtime_id, restarts=r.restarts, usage=WorkloadUsage.of(r),
            )
            for r in request.workloads
        ]
        await self.agents.report(request.node_id, reports, request.complete, VolumeReport.of(request))

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
                        ) -> pb.HeartbeatResponse:
        await self._as_node(request.node_id, context)
        await self._check_usage(request, context)
        async with self._budget(self.call_budget, request.node_id, context), mapped(context):
            return self._heartbeat(request)

    async def ReportStatus(self, request: pb.ReportStatusRequest, context: grpc.aio.ServicerContext
                           ) -> pb.ReportStatusResponse:
        await self._as_node(request.node_id, context)
        async with self._budget(self.call_budget, request.node_id, context), mapped(context):
            await self._report(request)
        return pb.ReportStatusResponse(accepted=True)

    async def StreamUpdates(self, request_iterator: AsyncIterator[pb.AgentUpdate],
                            context: grpc.aio.ServicerContext) -> AsyncIterator[pb.UpdateAck]:
        """Heartbeats are acknowledged on receipt; reports are persisted in order by a separate
        task (`ReportQueue`), so a slow status write (a busy store, an event bus down) never
        delays an acknowledgement: an agent judges its replica by those (persys.agent.failover)."""
        allowed: set[str] = set()  # node ids this stream's certificate was checked for
        reports = ReportQueue(self._report)
        async with contextlib.AsyncExitStack() as held:
            held.push_async_callback(reports.close)
            async for update in request_iterator:
                kind = update.WhichOneof("update")
                node_id = update.heartbeat.node_id if kind == "heartbeat" else update.report.node_id
                if node_id not in allowed:
                    await self._as_node(node_id, context)
                    await held.enter_async_context(self._budget(self.update_budget, node_id, context))
                    allowed.add(node_id)
                elif self.revocations is not None and self.revocations.is_revoked(node_id):
                    # A revoked node's stream ends at its next message (a heartbeat interval).
                    await self._not_revoked(node_id, context)
                if kind == "heartbeat":
                    # The hot path (one per node per interval): no coroutine or error-mapping
                    # context built per beat; an error is mapped to its status when it happens.
                    try:
                        reports.raise_failure()  # a report failed (e.g. leadership moved): the stream ends
                    except Exception as err:
                        await _mapped_error(context, err)
                    if refusal := self._usage_refusal(update.heartbeat):
                        await _refuse(context, refusal)
                    try:
                        # Every message is checked for ownership again (leadership may have moved
                        # meanwhile): heartbeat() and report() do it themselves.
                        ack = pb.UpdateAck(heartbeat=self._heartbeat(update.heartbeat))
                    except Exception as err:
                        await _mapped_error(context, err)
                    yield ack
                    continue
                async with mapped(context):
                    reports.raise_failure()
                if kind == "report":
                    await reports.put(update.report)
                # any other kind: an update this scheduler does not know (a newer agent)
            async with mapped(context):
                await reports.drain()

    async def WatchAssignments(self, request: pb.WatchAssignmentsRequest, context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[pb.AssignmentSet]:
        await self._as_node(request.node_id, context)
        async with self._budget(self.watch_budget, request.node_id, context):
            async for state in self._watch(request, context):
                yield state

    async def _watch(self, request: pb.WatchAssignmentsRequest, context: grpc.aio.ServicerContext
                     ) -> AsyncIterator[pb.AssignmentSet]:
        # The delta protocol is work/delivery.py's; this only converts its messages to protobuf.
        messages = self.s.delivery.messages(request.node_id, request.deltas, lambda: self.s.mode)
        while True:
            async with mapped(context):  # a deposed replica ends the stream with the new address
                msg = await anext(messages)
            await self._not_revoked(request.node_id, context)  # revocation wakes the stream: it ends here
            items = [pb.AssignedWorkload(instance_id=i.workload_id, revision=i.revision, generation=i.generation,
                                         desired_state=i.desired_state, spec_json=i.spec_json,
                                         traceparent=i.trace_parent,
                                         fence_node=volume_rules.fence_node(self.s.state, i.workload_id),
                                         device_ids=given_devices(self.s.state, request.node_id, i.workload_id))
                     for i in msg.items]
            yield pb.AssignmentSet(workloads=items, mode=msg.mode, store_revision=self.s.state.revision,
                                  full=msg.full, removed=msg.removed)

    # ---------------------------------------------------------------- client side

    async def _check_size(self, context: grpc.aio.ServicerContext, problem: str | None) -> None:
        if problem:  # before parsing: a huge document costs its bytes, never their parse
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)

    @staticmethod
    def _manifest(raw: bytes) -> WorkloadManifest:
        # Sizes were checked before (admission.InputLimits): a direct gRPC client meets the gateway's bounds.
        try:
            doc = load_json(raw)
        except DocumentError as err:
            raise ManifestError([str(err)]) from None
        return validate_manifest(doc)

    async def ApplyWorkload(self, request: pb.ApplyWorkloadRequest, context: grpc.aio.ServicerContext
                            ) -> pb.ApplyWorkloadResponse:
        await self._as_client(context)
        await self._check_size(context, self.limits.manifest_problem(request.manifest_json))
        async with mapped(context):
            # record=False: a refusal's text may quote the manifest; the span keeps the error's type.
            with tracing.span("scheduler.admission", {"persys.dry_run": request.dry_run}, record=False):
                manifest = self._manifest(request.manifest_json)
                await self.policy.admit([manifest])
            w, created, changed = await self.workloads.apply(manifest, dry_run=request.dry_run)
            view = self.s.workload_view(w.id) if not request.dry_run else {"id": w.id, "revision": w.revision}
            return pb.ApplyWorkloadResponse(workload_id=w.id, created=created, changed=changed,
                                            workload_json=dumps(view))

    async def ApplyWorkloads(self, request: pb.ApplyWorkloadsRequest, context: grpc.aio.ServicerContext
                             ) -> pb.ApplyWorkloadsResponse:
        await self._as_client(context)
        await self._check_size(context, self.limits.batch_problem(request.manifests_json))
        async with mapped(context):
            with tracing.span("scheduler.admission", {"persys.manifests": len(request.manifests_json)}, record=False):
                manifests = []
                for i, raw in enumerate(request.manifests_json):
                    try:
                        manifests.append(self._manifest(raw))
                    except (ManifestError, ValidationError) as err:
                        problems = err.problems if isinstance(err, ManifestError) else format_validation_error(err)
                        raise ManifestError([f"manifest {i + 1}: {p}" for p in problems]) from None
                await self.policy.admit(manifests)
            results = await self.workloads.apply_many(manifests)
            return pb.ApplyWorkloadsResponse(results=[
                pb.ApplyWorkloadResponse(workload_id=w.id, created=created, changed=changed)
                for w, created, changed in results])

    async def PlanWorkload(self, request: pb.ApplyWorkloadRequest, context: grpc.aio.ServicerContext
                           ) -> pb.Document:
        await self._as_client(context)
        await self._check_size(context, self.limits.manifest_problem(request.manifest_json))

        async def plan() -> dict[str, Any]:
            manifest = self._manifest(request.manifest_json)
            await self.policy.admit([manifest])
            return {
                "workload": manifest.metadata.name,
                "replicas": [{"instance": inst, "node": d.node_id, "explanation": d.explain_detailed(),
                              "decision": d.to_dict()} for inst, d in self.workloads.plan(manifest)],
            }

        return await self._document(context, plan)

    async def ExplainWorkload(self, request: pb.ExplainRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        if request.at_revision:
            return await self._replay(request, context)

        async def explain() -> dict[str, Any]:
            return self.workloads.explain(request.workload_id, request.node_id)

        return await self._document(context, explain)

    async def _replay(self, request: pb.ExplainRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        """`explain --at`: the decisions taken at that store revision, replayed (scheduler/api/replay.py)."""
        refused: replay.ReplayRefused | None = None

        async def again() -> dict[str, Any]:
            nonlocal refused
            try:
                return await replay.replay(self.s.state, self.s.placement.config, request.workload_id,
                                           request.at_revision)
            except replay.ReplayRefused as err:
                refused = err
                return {}

        answer = await self._document(context, again)
        if refused is not None:
            await context.abort(getattr(grpc.StatusCode, refused.code), str(refused))
        return answer

    async def PlanOperation(self, request: pb.PlanOperationRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        await self._as_client(context)
        await self._check_size(context, self.limits.manifest_problem(request.operation_json, "operation_json"))

        async def plan() -> dict[str, Any]:
            try:
                doc = json.loads(request.operation_json or b"{}")
            except ValueError as err:
                raise ManifestError([f"operation: not JSON ({err})"]) from None
            return await whatif_api.plan_operation(self.s.state, self.s.placement, doc)

        return await self._document(context, plan)

    async def WhatIfWorkload(self, request: pb.ExplainRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        async def what_if() -> dict[str, Any]:
            return whatif_api.what_if(self.s.state, self.s.placement, request.workload_id)

        return await self._document(context, what_if)

    async def ControlWorkload(self, request: pb.ControlWorkloadRequest, context: grpc.aio.ServicerContext
                              ) -> pb.Document:
        actions: dict[str, Callable[[], Awaitable[Any]]] = {
            "start": lambda: self.workloads.set_desired_state(request.workload_id, DesiredState.RUNNING),
            "stop": lambda: self.workloads.set_desired_state(request.workload_id, DesiredState.STOPPED),
            "restart": lambda: self.workloads.restart(request.workload_id),
        }
        if request.action not in actions:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"action must be one of {', '.join(actions)}")

        async def control() -> dict[str, Any]:
            await actions[request.action]()
            return self.s.workload_view(request.workload_id)

        return await self._document(context, control)

    async def MoveInstance(self, request: pb.MoveInstanceRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        async def move() -> dict[str, Any]:
            caller = CALLER.get(None)
            return await instance_move.move(self.s, request.workload_id, request.instance, request.to_node,
                                            caller.identity.principal if caller is not None else "", request.dry_run)

        return await self._document(context, move)

    async def ListRevisions(self, request: pb.GetRequest, context: grpc.aio.ServicerContext) -> pb.DocumentList:
        await self._as_client(context)
        async with mapped(context):
            items = revisions.history(await self.workloads.revisions(request.id))
            return pb.DocumentList(items=[dumps(i) for i in items])

    async def RollbackWorkload(self, request: pb.RollbackRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        async def rollback() -> dict[str, Any]:
            if request.generation < 0:
                raise ManifestError([f"generation: {request.generation} is not a generation (1 or more; 0: the "
                                     "one before the newest)"])
            before = self.s.state.workloads.get(request.workload_id)
            manifest, target = await self.workloads.rollback_manifest(request.workload_id, request.generation)
            await self.policy.admit([manifest])  # the policy may have changed since that spec was applied
            w, _, changed = await self.workloads.apply(manifest, rollback_of=target)
            return {"workload": w.id, "fromGeneration": before.value.generation if before else 0,
                    "toGeneration": target, "generation": w.generation, "revision": w.revision, "changed": changed}

        return await self._document(context, rollback)

    async def DeleteWorkload(self, request: pb.DeleteWorkloadRequest, context: grpc.aio.ServicerContext
                             ) -> pb.DeleteWorkloadResponse:
        await self._as_client(context)
        async with mapped(context):
            deleted, gone = await self.workloads.delete(request.workload_id)
            return pb.DeleteWorkloadResponse(deleted=deleted, already_gone=gone)

    async def GetWorkload(self, request: pb.GetRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        async def view() -> dict[str, Any]:
            return self.s.workload_view(request.id)

        return await self._document(context, view)

    async def _page(self, request: pb.ListRequest, context: grpc.aio.ServicerContext,
                    take: Callable[[str, int], Page]) -> pb.DocumentList:
        """One page of a list: `limit` items after the `continue_token`'s position."""
        await self._as_client(context)
        try:
            position, limit = decode_token(request.continue_token), page_limit(request.limit)
        except BadPageRequest as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        page = take(position.after, limit)
        token = "" if page.next_after is None else encode_token(page.next_after,
                                                                  position.revision or self.s.state.revision)
        return pb.DocumentList(items=page.items, continue_token=token)

    async def ListWorkloads(self, request: pb.ListRequest, context: grpc.aio.ServicerContext) -> pb.DocumentList:
        return await self._page(request, context,
                                lambda after, limit: self.s.workload_page(after, limit, request.node_id))

    async def GetNode(self, request: pb.GetRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        async def view() -> dict[str, Any]:
            return self.s.node_view(request.id)

        return await self._document(context, view)

    async def ListNodes(self, request: pb.ListRequest, context: grpc.aio.ServicerContext) -> pb.DocumentList:
        return await self._page(request, context, self.s.node_page)

    async def ListEvents(self, request: pb.ListEventsRequest, context: grpc.aio.ServicerContext
                         ) -> pb.DocumentList:
        await self._as_client(context)
        try:
            events = await self.s.events.recent(limit=min(max(request.limit, 0) or 100, MAX_EVENTS),
                                                subject=request.subject or None)
        except Exception as err:  # any backend failure: events are observability, say so plainly
            # The marker tells clients this replica answered: only the event bus is down.
            context.set_trailing_metadata(((UNAVAILABLE_METADATA, "event-bus"),))
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"event bus unavailable ({err}); the control plane is up")
        return pb.DocumentList(items=[
            dumps({"id": e.id, "ts": e.ts, "kind": e.kind, "subject": e.subject, "reason": e.reason,
                    "message": e.message, **({"fields": e.fields} if e.fields else {})}) for e in events
        ])

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        h = await self.s.health()
        lat = h["decisionLatency"]
        return pb.HealthResponse(
            decisions_sampled=lat["decisions"], decision_p50_ms=lat.get("p50Ms", 0.0),
            decision_p99_ms=lat.get("p99Ms", 0.0), decision_max_ms=lat.get("maxMs", 0.0),
            mode=h["mode"], store_ok=h["storeOk"], events_ok=h["eventsOk"], store_backend=h["storeBackend"],
            nodes_ready=h["nodesReady"], workloads=h["workloads"], detail=h["detail"],
            replica_id=h["replicaId"], active=h["active"], leader=h["leader"], elected_at=h["electedAt"],
            sharded=h["sharded"], owned_nodes=h["ownedNodes"], liveness=_liveness_pb(h["liveness"]),
            events_dropped=h["eventsDropped"], events_last_drop_at=h["eventsLastDropAt"],
            events_drops_unreported=h["eventsDropsUnreported"],
            role=h["role"], mirror_revision=h["mirror"]["revision"], store_revision=h["mirror"]["storeRevision"],
            mirror_lag=h["mirror"]["lag"], watch=h["mirror"]["watch"],
            compaction_recoveries=h["mirror"]["compactionRecoveries"],
            dependencies=[pb.DependencyHealth(**d) for d in h["dependencies"]],
            shards=[pb.ShardMember(**m) for m in h.get("shards", [])],
        )

    # ---------------------------------------------------------------- node operations

    async def _node_op(self, context: grpc.aio.ServicerContext, node_id: str,
                       op: Callable[[], Awaitable[Any]]) -> pb.Document:
        async def run() -> dict[str, Any]:
            await op()
            return self.s.node_view(node_id)

        return await self._document(context, run)

    async def CordonNode(self, request: pb.CordonRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        return await self._node_op(context, request.node_id, lambda: self.nodes.cordon(request.node_id, request.cordon))

    async def DrainNode(self, request: pb.DrainRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        async def drain() -> dict[str, Any]:
            await self.nodes.drain(request.node_id, request.deadline_seconds)
            return self.s.drain_status(request.node_id)

        return await self._document(context, drain)

    async def DrainStatus(self, request: pb.GetRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        async def status() -> dict[str, Any]:
            return self.s.drain_status(request.id)

        return await self._document(context, status)

    async def LabelNode(self, request: pb.LabelRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        return await self._node_op(context, request.node_id,
                                   lambda: self.nodes.label(request.node_id, dict(request.set), list(request.remove)))

    async def DeleteNode(self, request: pb.DeleteNodeRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        async def delete() -> dict[str, Any]:
            return await self.nodes.delete_node(request.node_id, force=request.force)

        return await self._document(context, delete)

    async def TaintNode(self, request: pb.TaintRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        def add() -> list[Taint]:
            return [Taint.model_validate({"key": t.key, "value": t.value, "effect": t.effect or "NoSchedule"})
                    for t in request.add]

        return await self._node_op(context, request.node_id,
                                   lambda: self.nodes.taint(request.node_id, add(), list(request.remove)))

    # ---------------------------------------------------------------- administration

    async def Backup(self, request: pb.BackupRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        await self._as_client(context)
        async with mapped(context):
            return pb.Document(json=await self.backups.backup_json())

    async def Restore(self, request: pb.RestoreRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        async def restore() -> dict[str, Any]:
            try:
                doc = self.backups.local_backup() if request.latest_local else json.loads(request.backup_json)
                if not isinstance(doc, dict):
                    raise ValueError("a backup is a JSON object")
                return await self.backups.restore(doc, force=request.force)
            except NotFound:
                raise  # no local backup (a KeyError too): NOT_FOUND, not an invalid one
            except (ValueError, KeyError, TypeError, RecursionError) as err:
                raise ManifestError([f"invalid backup: {err!s:.300}"]) from None

        return await self._document(context, restore)

    async def Recover(self, request: pb.RecoverRequest, context: grpc.aio.ServicerContext) -> pb.Document:
        if not request.confirm_empty:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "recovering accepts the store's current (empty) contents: confirm explicitly")
        return await self._document(context, self.backups.recover)

    async def ResumeLiveness(self, request: pb.ResumeLivenessRequest, context: grpc.aio.ServicerContext
                             ) -> pb.Document:
        caller = CALLER.get(None)
        via = caller.identity.principal if caller is not None else ""

        async def resume() -> dict[str, Any]:
            return self.s.resume_liveness(via or "an unauthenticated client")

        return await self._document(context, resume)
