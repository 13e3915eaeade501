"""An async client of the scheduler's AgentControl API (used by the gateway and tests).

Over 500 lines on purpose: one method per call of the scheduler's client API (73, each
a few lines turning arguments into a request and the answer into a document), all over one set
of channels with fail-over between replicas. A flat list, read by the call's name; split by
topic, every part would repeat the channel and fail-over handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from typing import Any, Protocol

import grpc

from persys._pb.persys.v1 import auth_pb2 as apb
from persys._pb.persys.v1 import auth_pb2_grpc as apb_grpc
from persys._pb.persys.v1 import (
    automation_pb2,
    automation_pb2_grpc,
    buckets_pb2,
    buckets_pb2_grpc,
    meter_pb2,
    meter_pb2_grpc,
    policy_pb2,
    policy_pb2_grpc,
    secrets_pb2,
    secrets_pb2_grpc,
    volumes_pb2,
    volumes_pb2_grpc,
    watch_pb2,
    watch_pb2_grpc,
)
from persys._pb.persys.v1 import certificates_pb2 as cpb
from persys._pb.persys.v1 import certificates_pb2_grpc as cpb_grpc
from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.observability.grpc_tracing import with_trace_context
from persys.security import forwarding, peer_names
from persys.security.grpc_tls import secure_channel
from persys.tlsfiles import TLSFiles


class SchedulerError(Exception):
    """A refused or failed call, with the gRPC status code name (e.g. NOT_FOUND). `retry_after`
    (seconds): the call was shed because the scheduler is overloaded; ask again after that."""

    def __init__(self, code: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after


# When the request being served should have its answer (a monotonic time), set per request by the
# gateway for reads (gateway.read_budget): a scheduler call still unanswered then, while the gate
# says the scheduler is `stalled` (overloaded and answering nothing), is shed as overloaded
# (503 + Retry-After) instead of answered with a 504 after the timeout; otherwise it keeps the
# client's own timeout (gateway.scheduler_gate says why). None: writes, other callers.
ANSWER_BY: ContextVar[float | None] = ContextVar("persys_answer_by", default=None)
OVERLOAD_RETRY_AFTER_S = 1


def overloaded(why: str) -> SchedulerError:
    return SchedulerError("UNAVAILABLE", f"the scheduler is overloaded: {why}; retry after "
                          f"{OVERLOAD_RETRY_AFTER_S}s", retry_after=OVERLOAD_RETRY_AFTER_S)


class CallGate(Protocol):
    """Bounds a client's calls in flight (gateway.scheduler_gate): entering waits for a slot at
    most until `answer_by` and raises SchedulerError (overloaded) when none comes; `stalled` while
    the calls it let through are not coming back and others wait."""

    def slot(self, answer_by: float | None) -> AbstractAsyncContextManager[None]: ...

    @property
    def stalled(self) -> bool: ...


RECHECK_S = 0.25  # how often a read past its budget looks again whether the scheduler is overloaded


def _document(raw: bytes | str) -> dict[str, Any]:
    """A JSON object the scheduler sent; anything else is a broken reply, not a document."""
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise SchedulerError("INTERNAL", f"the scheduler sent a JSON {type(doc).__name__} where an object belongs")
    return doc


def _liveness_doc(g: pb.LivenessGuard) -> dict[str, Any]:
    return {"suspended": g.suspended, "since": g.since, "endsAt": g.ends_at, "reason": g.reason,
            "silentNodes": g.silent_nodes, "judgedNodes": g.judged_nodes}


class SchedulerClient:
    def __init__(self, target: str, tls: TLSFiles, timeout: float = 10.0, gate: CallGate | None = None) -> None:
        # `target` may list several replicas ("a:7443,b:7443"): every replica serves this API,
        # so an unreachable one is skipped. All calls here are idempotent, so a retry is safe.
        self.targets = [t.strip() for t in target.split(",") if t.strip()]
        self.target = target
        self.timeout = timeout
        self.gate = gate  # None: calls are not bounded here
        self._retired: list[grpc.aio.Channel] = []
        self._dial(tls)
        self._current = 0

    def _dial(self, tls: TLSFiles) -> None:
        self._channels = [secure_channel(t, tls, expect=peer_names.SCHEDULER) for t in self.targets]
        self._stubs = [pb_grpc.AgentControlStub(c) for c in self._channels]
        self._policy_stubs = [policy_pb2_grpc.PolicyStub(c) for c in self._channels]
        self._auth_stubs = [apb_grpc.AuthStub(c) for c in self._channels]
        self._secret_stubs = [secrets_pb2_grpc.SecretsStub(c) for c in self._channels]
        self._node_access_stubs = [cpb_grpc.NodeAccessStub(c) for c in self._channels]
        self._watch_stubs = [watch_pb2_grpc.WatchStub(c) for c in self._channels]
        self._meter_stubs = [meter_pb2_grpc.MeterStub(c) for c in self._channels]
        self._volume_stubs = [volumes_pb2_grpc.VolumesStub(c) for c in self._channels]
        self._bucket_stubs = [buckets_pb2_grpc.BucketsStub(c) for c in self._channels]
        self._automation_stubs = [automation_pb2_grpc.AutomationStub(c) for c in self._channels]

    async def reload_tls(self, tls: TLSFiles) -> None:
        """New calls go out on channels with `tls` read again (a renewed certificate, a rotated CA
        bundle); calls and streams on the old channels finish there. Those retired by the reload
        before are closed now: a renewal comes at most every few minutes, far after their calls."""
        retired, self._retired = self._retired, list(self._channels)
        self._dial(tls)
        for c in retired:
            await c.close(grace=1.0)

    async def close(self) -> None:
        for c in [*self._channels, *self._retired]:
            await c.close()

    async def _call(self, method: str, request: Any, auth: bool = False,
                    metadata: forwarding.Metadata | None = None, stubs: list[Any] | None = None,
                    gated: bool = True) -> Any:
        """`gated`: counted in the gate (False: a probe's, which never waits behind API work)."""
        answer_by = ANSWER_BY.get()
        if self.gate is None or not gated or answer_by is None:  # the gate bounds reads (gateway.scheduler_gate)
            return await self._call_any(method, request, auth, metadata, stubs, answer_by)
        async with self.gate.slot(answer_by):
            return await self._call_any(method, request, auth, metadata, stubs, answer_by)

    async def _answer(self, call: Any, method: str, answer_by: float | None) -> Any:
        """The call's answer; past `answer_by`, while the gate says the scheduler is stalled, the
        call is cancelled (on the scheduler too: its work is dropped) and shed as overloaded."""
        gate = self.gate
        if answer_by is None or gate is None:
            return await call
        pending = asyncio.ensure_future(call)
        try:
            while True:
                left = answer_by - time.monotonic()
                done, _ = await asyncio.wait({pending}, timeout=left if left > 0 else RECHECK_S)
                if done:
                    return pending.result()
                if time.monotonic() >= answer_by and gate.stalled:
                    raise overloaded(f"{method} not answered within the read's budget, and nothing asked of it "
                                     "comes back while other calls wait")
        finally:
            if not pending.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await pending

    async def _call_any(self, method: str, request: Any, auth: bool, metadata: forwarding.Metadata | None,
                        stubs: list[Any] | None, answer_by: float | None) -> Any:
        # The caller a gateway serves rides along (security.forwarding); `metadata` overrides it.
        md = with_trace_context(forwarding.current() if metadata is None else metadata)
        stubs = stubs or (self._auth_stubs if auth else self._stubs)
        last: grpc.aio.AioRpcError | None = None
        for attempt in range(len(stubs)):
            i = (self._current + attempt) % len(stubs)
            try:
                call = getattr(stubs[i], method)(request, timeout=self.timeout, metadata=md or None)
                resp = await self._answer(call, method, answer_by)
                self._current = i
                return resp
            except grpc.aio.AioRpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or any(
                    k == "persys-unavailable" for k, _ in (err.trailing_metadata() or ())
                ):  # the replica answered (a dependency it names is down): not unreachable
                    raise SchedulerError(err.code().name, err.details() or err.code().name) from None
                last = err
        assert last is not None
        details = last.details() or last.code().name
        if last.code() == grpc.StatusCode.UNAVAILABLE and "degraded" not in details and "recovery" not in details:
            details = f"scheduler at {self.target} is unreachable: {details}"
        raise SchedulerError(last.code().name, details)

    async def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        resp = await self._call("ApplyWorkload", pb.ApplyWorkloadRequest(
            manifest_json=json.dumps(manifest).encode(), dry_run=dry_run))
        return {"id": resp.workload_id, "created": resp.created, "changed": resp.changed,
                "workload": json.loads(resp.workload_json or b"{}")}

    async def apply_many(self, manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        resp = await self._call("ApplyWorkloads", pb.ApplyWorkloadsRequest(
            manifests_json=[json.dumps(m).encode() for m in manifests]))
        return [{"id": r.workload_id, "created": r.created, "changed": r.changed} for r in resp.results]

    async def plan(self, manifest: dict[str, Any]) -> dict[str, Any]:
        resp = await self._call("PlanWorkload", pb.ApplyWorkloadRequest(manifest_json=json.dumps(manifest).encode()))
        return _document(resp.json)

    async def explain(self, workload_id: str, node_id: str = "", at_revision: int = 0) -> dict[str, Any]:
        """The stored explanation; with `at_revision`, the decisions taken then, replayed."""
        resp = await self._call("ExplainWorkload", pb.ExplainRequest(workload_id=workload_id, node_id=node_id,
                                                                     at_revision=at_revision))
        return _document(resp.json)

    async def plan_operation(self, operation: dict[str, Any]) -> dict[str, Any]:
        """What-if plan of an operation (docs/placement.md, "What-if plans")."""
        return await self._doc("PlanOperation", pb.PlanOperationRequest(operation_json=json.dumps(operation).encode()))

    async def what_if(self, workload_id: str) -> dict[str, Any]:
        """A Pending workload's counterfactuals (docs/placement.md, "Counterfactuals")."""
        return await self._doc("WhatIfWorkload", pb.ExplainRequest(workload_id=workload_id))

    async def control(self, workload_id: str, action: str) -> dict[str, Any]:
        return await self._doc("ControlWorkload", pb.ControlWorkloadRequest(workload_id=workload_id, action=action))

    async def move_instance(self, workload_id: str, instance: str, to_node: str = "", dry_run: bool = False
                            ) -> dict[str, Any]:
        """Move one instance to another node (docs/automation.md, "Moves")."""
        return await self._doc("MoveInstance", pb.MoveInstanceRequest(workload_id=workload_id, instance=instance,
                                                                      to_node=to_node, dry_run=dry_run))

    async def revisions(self, workload_id: str) -> list[dict[str, Any]]:
        resp = await self._call("ListRevisions", pb.GetRequest(id=workload_id))
        return [_document(i) for i in resp.items]

    async def rollback(self, workload_id: str, generation: int = 0) -> dict[str, Any]:
        """Roll back to a kept generation (0: the one before the newest). The default is resolved
        here first, so that a retry on another replica repeats the same rollback (a no-op once
        landed) instead of stepping back once more."""
        if generation == 0:
            kept = [r["generation"] for r in await self.revisions(workload_id)]
            generation = kept[-2] if len(kept) >= 2 else 0  # none: the scheduler says why
        return await self._doc("RollbackWorkload", pb.RollbackRequest(workload_id=workload_id, generation=generation))

    async def delete(self, workload_id: str) -> dict[str, Any]:
        resp = await self._call("DeleteWorkload", pb.DeleteWorkloadRequest(workload_id=workload_id))
        return {"id": workload_id, "deleted": resp.deleted, "alreadyGone": resp.already_gone}

    async def get_workload(self, workload_id: str) -> dict[str, Any]:
        return _document((await self._call("GetWorkload", pb.GetRequest(id=workload_id))).json)

    async def list_page(self, kind: str, node_id: str = "", limit: int = 0, token: str = ""
                        ) -> tuple[list[dict[str, Any]], str]:
        """One page of `workloads` or `nodes` and the token of the next ("" after the last)."""
        method = {"workloads": "ListWorkloads", "nodes": "ListNodes"}[kind]
        # The scheduler lowers a larger limit to its maximum anyway; int32 on the wire.
        resp = await self._call(method, pb.ListRequest(node_id=node_id, limit=min(limit, 1 << 30),
                                                       continue_token=token))
        return [json.loads(i) for i in resp.items], resp.continue_token

    async def list_all(self, kind: str, node_id: str = "") -> AsyncIterator[list[dict[str, Any]]]:
        """Every page of `workloads` or `nodes`, following the tokens."""
        token = ""
        while True:
            items, token = await self.list_page(kind, node_id, token=token)
            yield items
            if not token:
                return

    async def list_workloads(self, node_id: str = "") -> list[dict[str, Any]]:
        return [w async for page in self.list_all("workloads", node_id) for w in page]

    async def get_node(self, node_id: str) -> dict[str, Any]:
        return _document((await self._call("GetNode", pb.GetRequest(id=node_id))).json)

    async def list_nodes(self) -> list[dict[str, Any]]:
        return [n async for page in self.list_all("nodes") for n in page]

    async def events(self, limit: int = 100, subject: str = "") -> list[dict[str, Any]]:
        resp = await self._call("ListEvents", pb.ListEventsRequest(limit=limit, subject=subject))
        return [json.loads(i) for i in resp.items]

    async def watch_events(self, request: watch_pb2.WatchEventsRequest) -> AsyncIterator[watch_pb2.WatchEventMessage]:
        """The Watch/Events stream (see watch.proto) from the first replica that answers."""
        async for msg in self._stream("Events", request):
            yield msg

    async def watch_objects(self, kind: str, node_id: str = "", seconds: float = 0.0
                            ) -> AsyncIterator[watch_pb2.ObjectChange]:
        """Watch/Workloads or Watch/Nodes (kind "workloads" or "nodes"), for `seconds` (0: no end)."""
        request = watch_pb2.WatchObjectsRequest(node_id=node_id, timeout_seconds=seconds)
        async for msg in self._stream("Workloads" if kind == "workloads" else "Nodes", request):
            yield msg

    async def _stream(self, method: str, request: Any) -> AsyncIterator[Any]:
        # Fail over only before the first message: after it, the caller resumes (it knows where).
        md = forwarding.current()
        last: grpc.aio.AioRpcError | None = None
        for attempt in range(len(self._watch_stubs)):
            i = (self._current + attempt) % len(self._watch_stubs)
            call = getattr(self._watch_stubs[i], method)(request, metadata=md or None)
            started = False
            try:
                async for msg in call:
                    started = True
                    yield msg
                return
            except grpc.aio.AioRpcError as err:
                unreachable = err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and \
                    not any(k == "persys-unavailable" for k, _ in (err.trailing_metadata() or ()))
                if started or not unreachable:
                    raise SchedulerError(err.code().name, err.details() or err.code().name) from None
                last = err
            finally:
                call.cancel()
        assert last is not None
        raise SchedulerError(last.code().name, f"scheduler at {self.target} is unreachable: {last.details()}")

    async def _doc(self, method: str, request: Any) -> dict[str, Any]:
        return _document((await self._call(method, request)).json)

    async def cordon(self, node_id: str, on: bool) -> dict[str, Any]:
        return await self._doc("CordonNode", pb.CordonRequest(node_id=node_id, cordon=on))

    async def drain(self, node_id: str, deadline: float) -> dict[str, Any]:
        return await self._doc("DrainNode", pb.DrainRequest(node_id=node_id, deadline_seconds=deadline))

    async def drain_status(self, node_id: str) -> dict[str, Any]:
        return await self._doc("DrainStatus", pb.GetRequest(id=node_id))

    async def label(self, node_id: str, set_labels: dict[str, str], remove: list[str]) -> dict[str, Any]:
        return await self._doc("LabelNode", pb.LabelRequest(node_id=node_id, set=set_labels, remove=remove))

    async def taint(self, node_id: str, add: list[dict[str, str]], remove: list[str]) -> dict[str, Any]:
        taints = [pb.Taint(key=t["key"], value=t.get("value", ""), effect=t.get("effect", "")) for t in add]
        return await self._doc("TaintNode", pb.TaintRequest(node_id=node_id, add=taints, remove=remove))

    async def delete_node(self, node_id: str, force: bool = False) -> dict[str, Any]:
        return await self._doc("DeleteNode", pb.DeleteNodeRequest(node_id=node_id, force=force))

    async def resume_liveness(self) -> list[dict[str, Any]]:
        """End the liveness suspension on every replica (each judges its own nodes): one result
        per replica, an unreachable one with its error. Fails only if none answers."""
        results: list[dict[str, Any]] = []
        for target, stub in zip(self.targets, self._stubs, strict=True):
            try:
                resp = await stub.ResumeLiveness(pb.ResumeLivenessRequest(), timeout=self.timeout,
                                                 metadata=forwarding.current() or None)
                results.append({"target": target, **json.loads(resp.json)})
            except grpc.aio.AioRpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise SchedulerError(err.code().name, err.details() or err.code().name) from None
                results.append({"target": target, "error": err.details() or err.code().name})
        if all("error" in r for r in results):
            raise SchedulerError("UNAVAILABLE", f"no scheduler replica at {self.target} answered")
        return results

    async def backup(self) -> dict[str, Any]:
        return _document((await self._call("Backup", pb.BackupRequest())).json)

    async def restore(self, backup: dict[str, Any] | None, force: bool = False) -> dict[str, Any]:
        req = pb.RestoreRequest(backup_json=json.dumps(backup).encode() if backup else b"", force=force,
                                latest_local=backup is None)
        return _document((await self._call("Restore", req)).json)

    async def recover(self) -> dict[str, Any]:
        return _document((await self._call("Recover", pb.RecoverRequest(confirm_empty=True))).json)

    async def get_policy(self) -> dict[str, Any]:
        """The workload policy in force (`policy`) and whether it is stored (`stored`)."""
        resp = await self._call("GetPolicy", policy_pb2.GetPolicyRequest(), stubs=self._policy_stubs)
        return {"policy": json.loads(resp.policy_json), "stored": resp.stored}

    async def _meter_call(self, method: str, request: Any) -> Any:
        """A Meter call on the first replica that runs the meter (`--meter`): the others answer
        FAILED_PRECONDITION and unreachable ones are skipped, in replica order."""
        problem = SchedulerError("FAILED_PRECONDITION", "Persys Meter is not running: start a scheduler replica "
                                 "with --meter (docs/observability.md, \"Persys Meter\")")
        for stub in self._meter_stubs:
            try:
                return await getattr(stub, method)(request, timeout=self.timeout,
                                                   metadata=forwarding.current() or None)
            except grpc.aio.AioRpcError as err:
                details = err.details() or err.code().name
                if err.code() == grpc.StatusCode.FAILED_PRECONDITION and "does not run on this replica" in details:
                    continue
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise SchedulerError(err.code().name, details) from None
                problem = SchedulerError(err.code().name, f"scheduler at {self.target} is unreachable: {details}")
        raise problem

    async def meter_query(self, selector: str, value: str, metric: str, since: float, step: int, agg: str
                          ) -> dict[str, Any]:
        """Persys Meter: one series per instance (or node); a replica without the meter passes the call on."""
        resp = await self._meter_call("Query", meter_pb2.MeterQueryRequest(
            selector=selector, value=value, metric=metric, since_seconds=since, step_seconds=step, agg=agg))
        return {"engine": resp.engine, "start": resp.start, "end": resp.end, "step": step, "metric": metric,
                "agg": agg, "series": [{"key": s.key, "workload": s.workload, "node": s.node,
                                        "points": [[t, v] for t, v in zip(s.ts, s.values, strict=True)]}
                                       for s in resp.series]}

    async def meter_summary(self, kind: str, since: float, limit: int = 0) -> dict[str, Any]:
        resp = await self._meter_call("Summary", meter_pb2.MeterSummaryRequest(kind=kind, since_seconds=since,
                                                                                limit=limit))
        return {"engine": resp.engine, "start": resp.start, "end": resp.end, "kind": kind,
                "items": [{"name": i.name, "node": i.node, "samples": i.samples, "avg": dict(i.avg),
                           "max": dict(i.max)} for i in resp.items]}

    async def meter_status(self) -> dict[str, Any]:
        resp = await self._call("Status", meter_pb2.MeterStatusRequest(), stubs=self._meter_stubs)
        return _document(resp.json)

    async def set_policy(self, policy: dict[str, Any]) -> dict[str, Any]:
        req = policy_pb2.SetPolicyRequest(policy_json=json.dumps(policy).encode())
        resp = await self._call("SetPolicy", req, stubs=self._policy_stubs)
        return {"policy": json.loads(resp.policy_json), "stored": resp.stored}

    # ---------------------------------------------------------------- Secrets service (never values back)

    async def put_secret(self, name: str, data: dict[str, bytes]) -> dict[str, Any]:
        r = await self._call("PutSecret", secrets_pb2.PutSecretRequest(name=name, data=data),
                             stubs=self._secret_stubs)
        return {**_document(r.secret_json), "rolled": list(r.rolled)}

    async def get_secret(self, name: str) -> dict[str, Any]:
        r = await self._call("GetSecret", secrets_pb2.GetSecretRequest(name=name), stubs=self._secret_stubs)
        return _document(r.secret_json)

    async def list_secrets(self) -> list[dict[str, Any]]:
        r = await self._call("ListSecrets", secrets_pb2.ListSecretsRequest(), stubs=self._secret_stubs)
        return [_document(i) for i in r.items]

    async def delete_secret(self, name: str) -> bool:
        r = await self._call("DeleteSecret", secrets_pb2.DeleteSecretRequest(name=name), stubs=self._secret_stubs)
        return bool(r.deleted)

    # ---------------------------------------------------------------- Volumes service

    async def apply_volume(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        req = volumes_pb2.ApplyVolumeRequest(manifest_json=json.dumps(manifest).encode(), dry_run=dry_run)
        r = await self._call("ApplyVolume", req, stubs=self._volume_stubs)
        return {"volume": _document(r.volume_json), "created": r.created, "changed": r.changed}

    async def get_volume(self, name: str) -> dict[str, Any]:
        r = await self._call("GetVolume", volumes_pb2.GetVolumeRequest(name=name), stubs=self._volume_stubs)
        return _document(r.volume_json)

    async def list_volumes(self) -> list[dict[str, Any]]:
        r = await self._call("ListVolumes", volumes_pb2.ListVolumesRequest(), stubs=self._volume_stubs)
        return [_document(i) for i in r.items]

    async def snapshot_volume(self, name: str, snapshot: str, delete: bool = False) -> dict[str, Any]:
        req = volumes_pb2.SnapshotVolumeRequest(name=name, snapshot=snapshot, delete=delete)
        r = await self._call("SnapshotVolume", req, stubs=self._volume_stubs)
        return {"volume": _document(r.volume_json), "changed": r.changed}

    async def delete_volume(self, name: str) -> dict[str, bool]:
        r = await self._call("DeleteVolume", volumes_pb2.DeleteVolumeRequest(name=name), stubs=self._volume_stubs)
        return {"deleted": r.deleted, "alreadyGone": r.already_gone}

    # ---------------------------------------------------------------- Buckets service

    async def create_bucket(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        req = buckets_pb2.CreateBucketRequest(manifest_json=json.dumps(manifest).encode(), dry_run=dry_run)
        r = await self._call("CreateBucket", req, stubs=self._bucket_stubs)
        return {"bucket": _document(r.bucket_json), "created": r.created}

    async def get_bucket(self, name: str) -> dict[str, Any]:
        r = await self._call("GetBucket", buckets_pb2.GetBucketRequest(name=name), stubs=self._bucket_stubs)
        return _document(r.bucket_json)

    async def list_buckets(self) -> list[dict[str, Any]]:
        r = await self._call("ListBuckets", buckets_pb2.ListBucketsRequest(), stubs=self._bucket_stubs)
        return [_document(i) for i in r.items]

    async def delete_bucket(self, name: str, purge: bool = False) -> dict[str, bool]:
        req = buckets_pb2.DeleteBucketRequest(name=name, purge=purge)
        r = await self._call("DeleteBucket", req, stubs=self._bucket_stubs)
        return {"deleted": r.deleted, "alreadyGone": r.already_gone}

    async def create_bucket_key(self, bucket: str, role: str) -> dict[str, Any]:
        req = buckets_pb2.CreateBucketKeyRequest(bucket=bucket, role=role)
        r = await self._call("CreateBucketKey", req, stubs=self._bucket_stubs)
        return _document(r.key_json)

    async def list_bucket_keys(self, bucket: str) -> list[dict[str, Any]]:
        req = buckets_pb2.ListBucketKeysRequest(bucket=bucket)
        r = await self._call("ListBucketKeys", req, stubs=self._bucket_stubs)
        return [_document(i) for i in r.items]

    async def delete_bucket_key(self, bucket: str, key_id: str) -> dict[str, bool]:
        req = buckets_pb2.DeleteBucketKeyRequest(bucket=bucket, key_id=key_id)
        r = await self._call("DeleteBucketKey", req, stubs=self._bucket_stubs)
        return {"deleted": r.deleted, "alreadyGone": r.already_gone}

    # ---------------------------------------------------------------- Automation service

    async def apply_automation_policy(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        req = automation_pb2.ApplyAutomationPolicyRequest(manifest_json=json.dumps(manifest).encode(), dry_run=dry_run)
        r = await self._call("ApplyAutomationPolicy", req, stubs=self._automation_stubs)
        return {"policy": _document(r.policy_json), "created": r.created, "changed": r.changed}

    async def get_automation_policy(self, name: str) -> dict[str, Any]:
        r = await self._call("GetAutomationPolicy", automation_pb2.AutomationPolicyName(name=name),
                             stubs=self._automation_stubs)
        return _document(r.policy_json)

    async def list_automation_policies(self) -> dict[str, Any]:
        """{"items": [policy, ...], "pause": {"paused", "by", "at", "reason"}}."""
        r = await self._call("ListAutomationPolicies", automation_pb2.ListAutomationPoliciesRequest(),
                             stubs=self._automation_stubs)
        return {"items": [_document(i) for i in r.items], "pause": _document(r.pause_json)}

    async def delete_automation_policy(self, name: str) -> dict[str, bool]:
        r = await self._call("DeleteAutomationPolicy", automation_pb2.AutomationPolicyName(name=name),
                             stubs=self._automation_stubs)
        return {"deleted": r.deleted, "alreadyGone": r.already_gone}

    async def set_automation_pause(self, policy: str, paused: bool, reason: str = "") -> dict[str, Any]:
        req = automation_pb2.SetAutomationPauseRequest(policy=policy, paused=paused, reason=reason)
        r = await self._call("SetAutomationPause", req, stubs=self._automation_stubs)
        return {"items": [_document(i) for i in r.items], "pause": _document(r.pause_json)}

    async def automation_lease(self, holder: str, ttl: float, release: bool = False) -> dict[str, Any]:
        """Take, renew or give up the automation's leader lease (scheduler.automation_lease)."""
        req = automation_pb2.AutomationLeaseRequest(holder=holder, ttl_seconds=ttl, release=release)
        r = await self._call("AutomationLease", req, stubs=self._automation_stubs)
        return {"held": r.held, "holder": r.holder, "acquiredAt": r.acquired_at, "term": r.term}

    async def record_decisions(self, decisions: list[dict[str, Any]]) -> list[str]:
        req = automation_pb2.RecordDecisionsRequest(decisions=[json.dumps(d).encode() for d in decisions])
        r = await self._call("RecordDecisions", req, stubs=self._automation_stubs)
        return list(r.ids)

    async def list_decisions(self, policy: str = "", since: float = 0.0, limit: int = 0, outcome: str = ""
                             ) -> list[dict[str, Any]]:
        req = automation_pb2.ListDecisionsRequest(policy=policy, since=since, limit=limit, outcome=outcome)
        r = await self._call("ListDecisions", req, stubs=self._automation_stubs)
        return [_document(i) for i in r.items]

    async def health(self, as_self: bool = False) -> dict[str, Any]:
        """The health document; `as_self`: asked by this gateway itself, for no caller (/readyz,
        a public probe), instead of on behalf of the request being served."""
        h = await self._call("Health", pb.HealthRequest(), metadata=() if as_self else None, gated=not as_self)
        return {"mode": h.mode, "storeOk": h.store_ok, "eventsOk": h.events_ok, "storeBackend": h.store_backend,
                "nodesReady": h.nodes_ready, "workloads": h.workloads, "detail": h.detail,
                "replicaId": h.replica_id, "active": h.active, "leader": h.leader, "electedAt": h.elected_at,
                "sharded": h.sharded, "ownedNodes": h.owned_nodes, "liveness": _liveness_doc(h.liveness),
                "shards": [{"replica": m.replica, "address": m.address, "nodes": m.nodes} for m in h.shards],
                "decisionLatency": {"decisions": h.decisions_sampled, "p50Ms": h.decision_p50_ms,
                                    "p99Ms": h.decision_p99_ms, "maxMs": h.decision_max_ms},
                "eventsDropped": h.events_dropped, "eventsLastDropAt": h.events_last_drop_at,
                "eventsDropsUnreported": h.events_drops_unreported,
                "role": h.role,
                "mirror": {"revision": h.mirror_revision, "storeRevision": h.store_revision, "lag": h.mirror_lag,
                           "watch": h.watch, "compactionRecoveries": h.compaction_recoveries},
                "dependencies": [{"name": d.name, "ok": d.ok, "reason": d.reason, "configured": d.configured}
                                 for d in h.dependencies]}

    # ---------------------------------------------------------------- Auth service

    async def whoami(self, metadata: forwarding.Metadata | None = None) -> dict[str, Any]:
        r = await self._call("WhoAmI", apb.WhoAmIRequest(), auth=True, metadata=metadata)
        return {"principal": r.principal, "groups": list(r.groups), "roles": list(r.roles),
                "credential": r.credential, "via": r.via}

    async def can_i(self, verb: str, resource: str) -> dict[str, Any]:
        r = await self._call("CanI", apb.CanIRequest(verb=verb, resource=resource), auth=True)
        return {"verb": verb, "resource": resource, "allowed": r.allowed, "reason": r.reason}

    async def create_token(self, name: str, role: str, ttl_seconds: float = 0.0, description: str = ""
                           ) -> dict[str, Any]:
        r = await self._call("CreateToken", apb.CreateTokenRequest(
            name=name, role=role, ttl_seconds=ttl_seconds, description=description), auth=True)
        return {"token": r.token, **json.loads(r.token_json)}

    async def list_tokens(self) -> list[dict[str, Any]]:
        r = await self._call("ListTokens", apb.ListTokensRequest(), auth=True)
        return [json.loads(i) for i in r.items]

    async def revoke_token(self, token_id: str) -> dict[str, Any]:
        r = await self._call("RevokeToken", apb.RevokeTokenRequest(id=token_id), auth=True)
        doc: dict[str, Any] = json.loads(r.token_json)
        return doc

    async def audit(self, since: float = 0.0, who: str = "", limit: int = 100) -> dict[str, Any]:
        r = await self._call("ListAudit", apb.ListAuditRequest(since=since, who=who, limit=limit), auth=True)
        return {"items": [json.loads(i) for i in r.items], "kept": r.kept}

    async def record_audit(self, record: dict[str, Any]) -> None:
        """Record what this gateway did or refused itself; sent as the gateway, no one else."""
        await self._call("RecordAudit", apb.RecordAuditRequest(record_json=json.dumps(record).encode()),
                         auth=True, metadata=())

    # ---------------------------------------------------------------- NodeAccess service

    async def create_join_token(self, ttl_seconds: float, node_id: str = "", description: str = ""
                                ) -> dict[str, Any]:
        r = await self._call("CreateJoinToken", cpb.CreateJoinTokenRequest(
            ttl_seconds=ttl_seconds, node_id=node_id, description=description), stubs=self._node_access_stubs)
        return {**_document(r.token_json), "token": r.token, "caPin": r.ca_pin}

    async def list_join_tokens(self) -> list[dict[str, Any]]:
        r = await self._call("ListJoinTokens", cpb.ListJoinTokensRequest(), stubs=self._node_access_stubs)
        return [_document(i) for i in r.items]

    async def revoke_join_token(self, token_id: str) -> dict[str, Any]:
        r = await self._call("RevokeJoinToken", cpb.RevokeJoinTokenRequest(id=token_id), stubs=self._node_access_stubs)
        return _document(r.token_json)

    async def revoke_node(self, node_id: str, reason: str = "", force: bool = False) -> dict[str, Any]:
        r = await self._call("RevokeNode", cpb.RevokeNodeRequest(node_id=node_id, reason=reason, force=force),
                             stubs=self._node_access_stubs)
        return _document(r.revocation_json)
