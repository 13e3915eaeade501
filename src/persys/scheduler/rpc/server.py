"""Running a scheduler: open its store and event stream, serve AgentControl over mTLS."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path

import grpc

from persys._pb.persys.v1 import (
    auth_pb2_grpc,
    automation_pb2_grpc,
    buckets_pb2_grpc,
    certificates_pb2_grpc,
    policy_pb2_grpc,
    secrets_pb2_grpc,
    volumes_pb2_grpc,
    watch_pb2_grpc,
)
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.backend_access import BackendAccess
from persys.credentials import SecretResolver
from persys.events.base import EventBus
from persys.events.redis_stream import redacted
from persys.meter.query import Retention
from persys.meter.runner import Meter
from persys.observability import tracing
from persys.observability.grpc_metrics import MetricsInterceptor
from persys.observability.grpc_tracing import TracingInterceptor
from persys.observability.metrics import Metrics
from persys.observability.metrics_http import MetricsServer
from persys.policy import WorkloadPolicy
from persys.scheduler.access.admission import InputLimits
from persys.scheduler.access.audit import DEFAULT_KEEP, AuditLog
from persys.scheduler.access.revocations import NodeRevocations
from persys.scheduler.access.secret_admission import SecretAwareGate
from persys.scheduler.access.token_pepper import TokenPepper
from persys.scheduler.access.tokens import TokenStore
from persys.scheduler.access.workload_policy import PolicyGate
from persys.scheduler.api.automation import AutomationApi
from persys.scheduler.api.bucket_watch import bucket_watches
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.replica.backends import open_backends
from persys.scheduler.rpc.agent_control import AgentControlService
from persys.scheduler.rpc.authorization import AuthorizationInterceptor
from persys.scheduler.rpc.client.auth import AuthService
from persys.scheduler.rpc.client.automation import AutomationService
from persys.scheduler.rpc.client.buckets import BucketsService
from persys.scheduler.rpc.client.node_access import NodeAccessService
from persys.scheduler.rpc.client.policy import PolicyService
from persys.scheduler.rpc.client.volumes import VolumesService
from persys.scheduler.rpc.client.watch import WatchService
from persys.scheduler.rpc.meter_host import meter_check, serve_meter, start_meter
from persys.scheduler.rpc.node.certificates import DEFAULT_NODE_CERT_TTL, NodeCertificates, NodeCertificatesService
from persys.scheduler.rpc.node.join_server import start_join_server
from persys.scheduler.rpc.secrets import STORAGE_KEY, SecretDeliveryService, SecretsService, secret_store_check
from persys.scheduler.work.volume_controller import VolumeController
from persys.secrets.base import SecretStore, SecretStoreError
from persys.secrets.builtin import BuiltinSecretStore, MasterKeyMismatch
from persys.secrets.config import open_secret_store
from persys.security.cluster_id import cluster_id_of_file
from persys.security.grpc_tls import server_credentials, server_options
from persys.security.metrics_access import serve_metrics
from persys.security.signer import CertificateSigner
from persys.storage.base import StorageError, VolumeDriver
from persys.storage.ceph_open import open_ceph
from persys.storage.config import CephConfig, StorageConfig
from persys.storage.probe import build_drivers
from persys.storage.rgw import RgwAdmin
from persys.storage.rgw_access import open_rgw
from persys.store.base import BlockingLeases, StateStore
from persys.store.metered import MeteredStore
from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)
KEY_RETRY_S = 5.0  # how often a storage key missing from the secret store is looked for again


@dataclass
class RunningScheduler:
    scheduler: Scheduler
    server: grpc.aio.Server
    port: int
    store: StateStore
    events: EventBus
    audit: AuditLog | None = None
    secrets: SecretStore | None = None
    revocations: NodeRevocations | None = None
    join_server: grpc.aio.Server | None = None
    join_port: int = 0  # the join listener's port (0: none)
    metrics: Metrics | None = None
    metrics_servers: list[MetricsServer] = dataclasses.field(default_factory=list)
    meter: Meter | None = None
    rgw: RgwAdmin | None = None  # the Buckets service's (storage.rgw)

    async def stop(self, grace: float = 1.0) -> None:
        # Release the leader lease before draining calls: a standby takes over at once instead
        # of after the drain.
        await self.scheduler.election.stop()
        for m in self.metrics_servers:
            await m.stop()
        if self.join_server is not None:
            await self.join_server.stop(grace)
        await self.server.stop(grace)
        if self.revocations is not None:
            await self.revocations.stop()
        await self.scheduler.stop()
        if self.meter is not None:
            await self.meter.stop()  # its store and the sample bus
        elif self.scheduler.sample_outbox is not None:
            await self.scheduler.sample_outbox.bus.close()  # --meter publish
        if self.audit is not None:
            await self.audit.stop()
        await self.events.close()
        if self.secrets is not None:
            await self.secrets.close()
        if self.rgw is not None:
            self.rgw.close()
        await self.store.close()


def volume_services(scheduler: Scheduler, storage: StorageConfig | None, secrets: SecretStore | None = None,
                    cluster_id: str = "") -> list[Callable[[], Coroutine[None, None, None]]]:
    """The volume controller over the network backends of `storage` (none: no controller). A
    ceph-rbd section without keyFile takes its key from the secret store: the controller starts
    without that driver and adds it once the secret is there. `cluster_id`: the cluster's, as its
    agents name volumes with it (storage.probe.build_drivers)."""
    if storage is None:
        return []
    built = build_drivers(storage, "scheduler", ceph=open_ceph, cluster_id=cluster_id)
    keyed = storage.ceph is not None and isinstance(built.get("ceph-rbd"), str) and not storage.ceph.key_file
    for name, why in built.items():
        if isinstance(why, str) and not (name == "ceph-rbd" and keyed):
            log.error("volume controller: %s driver unavailable: %s", name, why)
    drivers = {k: d for k, d in built.items() if not isinstance(d, str)}

    async def run() -> None:
        controller = VolumeController(scheduler, drivers)
        if not keyed or storage.ceph is None:
            await controller.run()
            return
        keying = asyncio.create_task(_add_keyed_ceph(controller, drivers, storage.ceph, secrets, cluster_id))
        try:
            await controller.run()
        finally:
            keying.cancel()
            await asyncio.gather(keying, return_exceptions=True)

    return [run]


async def _add_keyed_ceph(controller: VolumeController, drivers: dict[str, VolumeDriver], ceph: CephConfig,
                          secrets: SecretStore | None, cluster_id: str = "") -> None:
    """Read the cephx key from the secret store until it is there, then drive ceph-rbd volumes
    too (the driver is kept across activations of this replica)."""
    warned = False
    while "ceph-rbd" not in drivers:
        try:
            if secrets is None:
                raise StorageError("no secret store (persys scheduler --secrets) to read it from")
            data, _ = await secrets.get(ceph.secret_name)
            key = data.get(STORAGE_KEY, b"").decode().strip()
            drivers["ceph-rbd"] = await asyncio.to_thread(open_ceph, ceph, "scheduler", cluster_id, key)
        except (SecretStoreError, StorageError, UnicodeDecodeError) as err:
            if not warned:
                log.warning("volume controller: ceph-rbd waits for its cephx key (secret %s, entry %r): %s",
                            ceph.secret_name, STORAGE_KEY, err)
                warned = True
            await asyncio.sleep(KEY_RETRY_S)
            continue
        log.info("volume controller: ceph-rbd driven with the key of secret %s", ceph.secret_name)
    controller.add_driver("ceph-rbd", drivers["ceph-rbd"])


def storage_keys(storage: StorageConfig | None) -> dict[str, str]:
    """driver -> the secret nodes may read its key from (their own storage's key, nothing else)."""
    return {"ceph-rbd": storage.ceph.secret_name} if storage is not None and storage.ceph is not None else {}


async def _secret_store(secrets: str | None, store: StateStore, events: EventBus,
                        config: SchedulerConfig) -> SecretStore | None:
    """The secret store (None without one); a built-in one whose master key does not open the
    stored secrets closes the backends and raises MasterKeyMismatch."""
    secret_store = open_secret_store(secrets, store, (config.data_dir or Path(".")) / "secrets.key") \
        if secrets else None
    if isinstance(secret_store, BuiltinSecretStore):
        try:
            await secret_store.check_master_key()
        except MasterKeyMismatch:
            await events.close()
            await store.close()
            raise
    return secret_store


async def start_scheduler(
    store_url: str,
    events_url: str,
    listen: str,
    tls: TLSFiles,
    config: SchedulerConfig | None = None,
    store_tls: TLSFiles | None = None,
    limits: InputLimits | None = None,
    audit_keep: int = DEFAULT_KEEP,
    policy_defaults: WorkloadPolicy | None = None,
    node_simulators: frozenset[str] = frozenset(),
    credentials: grpc.ServerCredentials | None = None,
    secrets: str | None = None,
    store_access: BackendAccess | None = None,
    events_access: BackendAccess | None = None,
    secret_resolver: SecretResolver | None = None,
    signer_for: Callable[[StateStore], CertificateSigner] | None = None,
    join_listen: str = "",
    node_cert_ttl: float = DEFAULT_NODE_CERT_TTL,
    metrics_listen: str = "",
    metrics_plain_listen: str = "",
    metrics: bool = True,
    meter: str = "off",
    meter_retention: Retention | None = None,
    storage: StorageConfig | None = None,
) -> RunningScheduler:
    """`credentials` replaces those read once from `tls` (a renewing identity's, which follow
    its certificate for new handshakes: `security.grpc_reload`). `secrets`: the secret store
    (persys.secrets.config: builtin[:KEYFILE], openbao); None: none (secret calls answer
    UNAVAILABLE and token records keep a bare sha256). `store_access`/`events_access`: the
    backends' own TLS identities and users (scheduler.backends); `secret_resolver` resolves their
    `secret:` password references (never a store kept in the backend it unlocks).
    `signer_for(store)` gives the signer of node certificates (Join on `join_listen`, Renew on
    the main port; `cli.servers.signer_options.signer_from_options` records each in the registry);
    without one, nodes bring certificates issued elsewhere (`persys certs issue`).
    `metrics`: count gRPC calls and store operations (off: neither is wrapped; for measuring
    what they cost); `metrics_listen`/`metrics_plain_listen`: serve them (security.metrics_access)."""
    store, events = await open_backends(store_url, events_url, store_tls, store_access, events_access,
                                        secret_resolver)
    config = config or SchedulerConfig()
    registry = Metrics() if metrics else None
    if registry is not None:
        store = MeteredStore(store, registry)
    secret_store = await _secret_store(secrets, store, events, config)
    # With etcd, the leader lease is kept alive from a thread with its own connection, so a
    # saturated event loop does not depose a healthy leader (the embedded store is one process).
    keeper = store.blocking_lease if isinstance(store, BlockingLeases) else None
    # Bind first: with port 0 the kernel picks the port, and the address this replica advertises
    # (leader key, redirects) must carry the real one before the election can publish it.
    limits = limits or InputLimits()
    # Every client call is authorized (and mutations audited) before it reaches a service.
    tokens = TokenStore(store, TokenPepper(secret_store) if secret_store is not None else None)
    audit = AuditLog(store, keep=audit_keep)
    # Tracing first (when on), then metrics: what authorization refuses is traced and counted, with the code.
    interceptors = ([TracingInterceptor()] if tracing.enabled() else []) + \
        ([MetricsInterceptor(registry)] if registry is not None else []) + [AuthorizationInterceptor(tokens, audit)]
    server = grpc.aio.server(options=server_options(limits.max_message_bytes), interceptors=interceptors)
    port = server.add_secure_port(listen, credentials or server_credentials(tls))
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    if config.advertise.endswith(":0"):
        config = dataclasses.replace(config, advertise=f"{config.advertise[:-2]}:{port}")
    # Persys Meter (rpc/meter_host.py): the bus samples go out on, and the meter if it runs here.
    active: list[Scheduler] = []
    samples, running_meter = await start_meter(meter, meter_retention, events, config.data_dir or Path("."),
                                               config.replica_id or config.advertise,
                                               lambda: bool(active) and active[0].is_active)
    scheduler = Scheduler(store, events, config, blocking_lease=keeper, metrics=registry, samples=samples)
    active.append(scheduler)
    if running_meter is not None:
        scheduler.meter_status = running_meter.status
        scheduler.health_checks.append(meter_check(running_meter))  # health per dependency
    serve_meter(server, running_meter, scheduler.meter_view)
    auth_pb2_grpc.add_AuthServicer_to_server(AuthService(tokens, audit), server)
    # The workload policy (defaults until an admin stores one), and secret references at admission.
    gate = PolicyGate(store, policy_defaults) if secret_store is None \
        else SecretAwareGate(store, secret_store, policy_defaults)
    # Revoked node identities, refused on every node call; a revocation wakes the node's watch to end it.
    revocations = NodeRevocations(store, on_revoked=scheduler.delivery.ask_resync)
    pb_grpc.add_AgentControlServicer_to_server(AgentControlService(scheduler, limits=limits, policy=gate,
                                                                  node_simulators=node_simulators,
                                                                  revocations=revocations), server)
    signer = signer_for(store) if signer_for is not None else None
    certificates_pb2_grpc.add_NodeAccessServicer_to_server(NodeAccessService(store, revocations, signer), server)
    certs = NodeCertificates(signer, store, revocations, audit, node_cert_ttl) if signer is not None else None
    if certs is not None:
        certificates_pb2_grpc.add_NodeCertificatesServicer_to_server(NodeCertificatesService(certs), server)
    policy_pb2_grpc.add_PolicyServicer_to_server(PolicyService(scheduler, gate), server)
    watch_pb2_grpc.add_WatchServicer_to_server(WatchService(scheduler), server)  # events -f, get -w
    volumes_pb2_grpc.add_VolumesServicer_to_server(VolumesService(scheduler, limits), server)
    # Volumes carry the cluster's id (from the CA its agents trust too), as the agents' drivers name them.
    scheduler.active_services += volume_services(scheduler, storage, secret_store,
                                                 cluster_id_of_file(tls.ca) if storage is not None else "")
    # Buckets on RGW (storage.rgw): served always, so that without an rgw section a call says so.
    rgw = open_rgw(storage.rgw) if storage is not None and storage.rgw is not None else None
    buckets = BucketsService(scheduler, rgw, secret_store, limits)
    buckets_pb2_grpc.add_BucketsServicer_to_server(buckets, server)
    scheduler.active_services += bucket_watches(buckets.api)  # Lost buckets shown, older keys confined
    # Automation policies and the decision log (docs/automation.md); the decisions' counts on /metrics.
    automation_pb2_grpc.add_AutomationServicer_to_server(AutomationService(AutomationApi(scheduler), limits), server)
    if secret_store is not None:
        secrets_pb2_grpc.add_SecretsServicer_to_server(SecretsService(scheduler, secret_store), server)
        secrets_pb2_grpc.add_SecretDeliveryServicer_to_server(
            SecretDeliveryService(scheduler, secret_store, node_simulators=node_simulators,
                                  storage_keys=storage_keys(storage)), server)
        scheduler.health_checks.append(secret_store_check(secret_store))
    await scheduler.start()
    audit.start()
    revocations.start()
    await server.start()
    join_server, join_port = None, 0
    if certs is not None and join_listen:
        join_server, join_port = await start_join_server(join_listen, tls, certs)
        log.info("join listener on %s", join_listen)
    log.info("scheduler listening on %s (store %s, events %s)", listen, store_url, redacted(events_url))
    running = RunningScheduler(scheduler, server, port, store, events, audit, secret_store, revocations, join_server,
                               join_port, registry, meter=running_meter, rgw=rgw)
    if registry is not None and (metrics_listen or metrics_plain_listen):
        try:
            running.metrics_servers = await serve_metrics(registry, tls, metrics_listen, metrics_plain_listen)
        except BaseException:
            await running.stop(0)
            raise
    return running
