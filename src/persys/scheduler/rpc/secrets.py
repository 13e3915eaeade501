"""The Secrets and SecretDelivery gRPC services (proto/persys/v1/secrets.proto).

Secrets (clients): authorized by the interceptor (security.permissions: list for viewers, get,
apply and delete for operators and admins) and audited without values (map fields stay out of
audit records). No answer carries a value. The control plane's own secrets (persys/system/...)
are neither listed nor reachable here. A new version restarts the workloads that use it
(secrets.refs.to_roll).

SecretDelivery (nodes): node <id>'s certificate receives the values an instance assigned to
node <id> references, resolved from the secret store at this moment; nothing else.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from persys._pb.persys.v1 import secrets_pb2 as pb
from persys._pb.persys.v1 import secrets_pb2_grpc as pb_grpc
from persys.aborting import abort, aborting
from persys.model.workload import workload_of
from persys.observability.health_checks import CheckResult, NamedCheck
from persys.scheduler.access import node_admission
from persys.scheduler.access.call_budget import CALLS_PER_NODE, CallBudget, OverBudgetError
from persys.scheduler.errors import Frozen, MutationRefused, NotFound
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.rpc.authorization import CALLER
from persys.scheduler.rpc.status import mapped
from persys.secrets import refs
from persys.secrets.base import (
    MAX_SECRETS,
    SecretInfo,
    SecretInvalid,
    SecretNotFound,
    SecretStore,
    SecretStoreError,
    SecretUnavailable,
    check_data,
    check_name,
    is_system,
)
from persys.security.identity import Identity, Kind
from persys.security.peer import peer_identity_of
from persys.security.roles import decide

log = logging.getLogger(__name__)
STORAGE_KEY = "key"  # the entry of a storage secret that holds the key (ceph-rbd: the cephx key)


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


@aborting
@contextlib.asynccontextmanager
async def secret_errors(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """Secret store failures as gRPC statuses; their messages never carry a value."""
    try:
        yield
    except SecretInvalid as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    except SecretNotFound as err:
        await context.abort(grpc.StatusCode.NOT_FOUND, str(err))
    except SecretUnavailable as err:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"secret store unavailable: {err}")
    except SecretStoreError as err:
        await context.abort(grpc.StatusCode.INTERNAL, f"secret store: {err}")


def listing(infos: list[SecretInfo], with_keys: bool) -> list[dict[str, Any]]:
    """What a client sees of the workload secrets (pure): never system ones, keys only if allowed."""
    out = []
    for i in infos:
        if is_system(i.name):
            continue
        doc = i.to_doc()
        if not with_keys:
            doc.pop("keys")
        out.append(doc)
    return out


class SecretsService(pb_grpc.SecretsServicer):
    def __init__(self, scheduler: Scheduler, secrets: SecretStore, require_identity: bool = True) -> None:
        self.s = scheduler
        self.secrets = secrets
        self.require_identity = require_identity

    async def _allow(self, context: grpc.aio.ServicerContext, name: str | None = None) -> None:
        if self.require_identity and CALLER.get(None) is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "secret calls need the authorization layer")
        if name is not None:
            try:
                check_name(name, system_ok=False)
            except SecretInvalid as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))

    async def _roll(self, name: str) -> list[str]:
        """Restart (a new revision) every workload that uses `name` and rolls on change."""
        rolled = []
        for wid in refs.to_roll((v.value for v in self.s.state.workloads.values()), name):
            try:
                await self.s.workload_api.restart(wid)
            except (NotFound, MutationRefused, Frozen) as err:
                log.warning("secret %s changed but workload %s was not restarted: %s", name, wid, err)
                continue
            rolled.append(wid)
        return rolled

    async def PutSecret(self, request: pb.PutSecretRequest, context: grpc.aio.ServicerContext  # noqa: N802
                        ) -> pb.SecretAnswer:
        await self._allow(context, request.name)
        data = dict(request.data)
        async with secret_errors(context):
            check_data(data)
            names = await self.secrets.names()
            if request.name not in names and len(names) >= MAX_SECRETS:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"the store holds {len(names)} secrets, the most it takes ({MAX_SECRETS})")
            version = await self.secrets.put(request.name, data)
            info = await self.secrets.info(request.name)
        self.s.emit("SecretChanged", f"secret/{request.name}", f"version {version}, keys {', '.join(info.keys)}")
        async with mapped(context):
            rolled = await self._roll(request.name) if version > 1 else []
        return pb.SecretAnswer(secret_json=_dumps(info.to_doc()), rolled=rolled)

    async def GetSecret(self, request: pb.GetSecretRequest, context: grpc.aio.ServicerContext  # noqa: N802
                        ) -> pb.SecretAnswer:
        await self._allow(context, request.name)
        async with secret_errors(context):
            info = await self.secrets.info(request.name)
        users = sorted(w.value.id for w in self.s.state.workloads.values()
                       if w.value.spec.secrets is not None and request.name in w.value.spec.secrets.names())
        return pb.SecretAnswer(secret_json=_dumps({**info.to_doc(), "usedBy": users[:100]}))

    async def ListSecrets(self, request: pb.ListSecretsRequest, context: grpc.aio.ServicerContext  # noqa: N802
                          ) -> pb.ListSecretsResponse:
        await self._allow(context)
        caller = CALLER.get(None)
        with_keys = caller is None or decide(caller.identity, "get", "secrets").allowed
        async with secret_errors(context):
            infos = await self.secrets.list()
        return pb.ListSecretsResponse(items=[_dumps(d) for d in listing(infos, with_keys)])

    async def DeleteSecret(self, request: pb.DeleteSecretRequest, context: grpc.aio.ServicerContext  # noqa: N802
                           ) -> pb.DeleteSecretResponse:
        await self._allow(context, request.name)
        async with secret_errors(context):
            deleted = await self.secrets.delete(request.name)
        if deleted:
            self.s.emit("SecretDeleted", f"secret/{request.name}", "deleted")
        return pb.DeleteSecretResponse(deleted=deleted)


class SecretDeliveryService(pb_grpc.SecretDeliveryServicer):
    def __init__(self, scheduler: Scheduler, secrets: SecretStore, require_identity: bool = True,
                 node_simulators: frozenset[str] = frozenset(), storage_keys: Mapping[str, str] | None = None
                 ) -> None:
        self.s = scheduler
        self.secrets = secrets
        # driver -> the secret holding its key, as the scheduler's storage configuration names it:
        # the only secrets a node may read for itself.
        self.storage_keys = dict(storage_keys or {})
        self.require_identity = require_identity
        self.node_simulators = node_simulators
        self.budget = CallBudget(CALLS_PER_NODE, "secret resolutions in progress")

    async def ResolveSecrets(self, request: pb.ResolveSecretsRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> pb.ResolveSecretsResponse:
        await self._as_node(request.node_id, context)
        try:
            return await self._resolve(request, context)
        finally:
            self.budget.release(request.node_id)

    async def ResolveStorageKey(self, request: pb.ResolveStorageKeyRequest,  # noqa: N802
                                context: grpc.aio.ServicerContext) -> pb.ResolveStorageKeyResponse:
        await self._as_node(request.node_id, context)
        try:
            name = self.storage_keys.get(request.driver)
            if name is None or request.secret_name != name:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, (
                    f"secret {request.secret_name[:80]!r} is not the {request.driver[:20]} key the cluster's storage "
                    f"configuration names (persys scheduler --storage: "
                    f"{f'secretName {name}' if name else 'no such driver'})"))
            async with secret_errors(context):
                data, _ = await self.secrets.get(request.secret_name)
            key = data.get(STORAGE_KEY)
            if not key:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"secret {request.secret_name} has no key {STORAGE_KEY!r}")
            log.info("node %s was handed the %s key (secret %s)", request.node_id, request.driver,
                     request.secret_name)
            return pb.ResolveStorageKeyResponse(key=key)
        finally:
            self.budget.release(request.node_id)

    async def _as_node(self, node_id: str, context: grpc.aio.ServicerContext) -> None:
        """The caller is node `node_id`, owned by this replica, within its budget (acquired: the
        caller releases it)."""
        async with mapped(context):
            self.s.require_owner(node_id)
        caller = peer_identity_of(context) if self.require_identity else Identity(Kind.NODE, node_id)
        refusal = node_admission.caller_refusal(caller, node_id, self.node_simulators)
        if refusal:
            await context.abort(grpc.StatusCode[refusal.code.value], str(refusal))
        try:
            self.budget.acquire(node_id)
        except OverBudgetError as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))

    async def _resolve(self, request: pb.ResolveSecretsRequest, context: grpc.aio.ServicerContext
                       ) -> pb.ResolveSecretsResponse:
        assigned = self.s.state.assignments.get(request.node_id, {}).get(request.instance_id)
        if assigned is None:  # never another node's instances, nor ones withdrawn from this node
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"instance {request.instance_id[:80]!r} is not assigned to node {request.node_id}")
        w = self.s.state.workloads.get(workload_of(request.instance_id))
        if w is None or w.value.spec.secrets is None:
            return pb.ResolveSecretsResponse(revision=w.value.revision if w else "")
        values: dict[str, dict[str, bytes]] = {}
        async with secret_errors(context):
            for name in sorted(w.value.spec.secrets.names()):
                with contextlib.suppress(SecretNotFound):  # material() names what is missing
                    values[name] = (await self.secrets.get(name))[0]
        m = refs.material(w.value.spec.secrets, values)
        if isinstance(m, str):
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, m)
        return pb.ResolveSecretsResponse(env=m.env, files=m.files, registry_auth=m.registry_auth,
                                         revision=w.value.revision)


def secret_store_check(store: SecretStore) -> NamedCheck:
    """Health's check of the secret store: can it list names (no value is read)."""

    async def check() -> CheckResult:
        try:
            names = await store.names()
        except SecretStoreError as err:
            return CheckResult(False, str(err))
        return CheckResult(True, f"{len(names)} secret(s)")

    return NamedCheck("secret-store", check)
