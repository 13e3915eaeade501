"""`persys dev`: scheduler, agent(s) and gateway in one process on embedded defaults (SQLite
store and event log, built-in secrets, DuckDB meter), with the local user's admin identity."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml
from pydantic import ValidationError

from persys.cli.config import ClientConfig, persys_home
from persys.cli.servers import tracing_opts
from persys.cli.servers.common import (
    check_node_id,
    default_runtimes,
    free_port,
    parse_labels,
    parse_taints,
    port_free,
    read_storage_config,
    run_main,
    setup_logging,
    until_signalled,
)
from persys.cli.servers.dev_automation import AUTOMATION_USER, start_dev_automation
from persys.cli.servers.errors import ServerError
from persys.model import Taint
from persys.model.devices import MAX_NODE_DEVICES, Device
from persys.security.cluster_id import cluster_id_of_file
from persys.security.pki import ADMIN_GROUPS, ClusterCA, standard_identities
from persys.storage.config import LocalConfig, StorageConfig, StorageConfigError, parse_storage_config

if TYPE_CHECKING:
    from persys.agent.agent import Agent
    from persys.gateway.server import RunningGateway
    from persys.scheduler.rpc.server import RunningScheduler
from persys.tlsfiles import TLSFiles


@dataclass
class DevNode:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    cpu_millicores: int = 0
    memory_mb: int = 0
    storage: StorageConfig | None = None  # this node's own (its `storage:`), else persys dev's
    disk_mb: int = 0  # 0: what the host has
    runtimes: tuple[str, ...] = ()  # the runtimes this node offers, among the host's (empty: all)
    devices: list[Device] | None = None  # simulated GPUs advertised instead of the host's (None: detect)


DEV_RUNTIMES = ("container", "compose", "vm", "microvm", "process")


def dev_nodes(path: Path) -> list[DevNode]:
    """Nodes for `persys dev --nodes FILE`: a YAML list of {name, labels, taints, cpuMillicores,
    memoryMb, diskMb, runtimes, storage} (`storage`: a storage file's sections, e.g. `simulate:
    {ceph-rbd: [vm-disk]}` to try storage-aware placement without the hardware; `runtimes`: the
    ones this node offers, among those the host has, e.g. [process] for a node without Docker)."""
    if not path.exists():
        raise ServerError(f"{path}: no such file")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ServerError(f"{path}: not valid YAML ({e})") from None
    items = doc.get("nodes") if isinstance(doc, dict) else doc
    if not isinstance(items, list) or not items:
        raise ServerError(f"{path}: expected a list of nodes (or a mapping with `nodes:`)")
    out = [_dev_node(item, f"{path}: nodes[{i}]") for i, item in enumerate(items)]
    if len({n.name for n in out}) != len(out):
        raise ServerError(f"{path}: node names must be unique")
    return out


def _dev_node(item: Any, where: str) -> DevNode:
    known = {"name", "labels", "taints", "cpuMillicores", "memoryMb", "diskMb", "runtimes", "storage", "devices"}
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ServerError(f"{where}.name: required")
    unknown = set(item) - known
    if unknown:
        raise ServerError(f"{where}.{sorted(unknown)[0]}: unknown field")
    for num in ("cpuMillicores", "memoryMb", "diskMb"):
        if not isinstance(item.get(num, 0), int) or item.get(num, 0) < 0:
            raise ServerError(f"{where}.{num}: must be a non-negative integer")
    runtimes = item.get("runtimes") or []
    if not isinstance(runtimes, list) or not all(r in DEV_RUNTIMES for r in runtimes):
        raise ServerError(f"{where}.runtimes: a list among {', '.join(DEV_RUNTIMES)}")
    labels = item.get("labels") or {}
    if not isinstance(labels, dict):
        raise ServerError(f"{where}.labels: must be a mapping")
    try:
        storage = parse_storage_config(item["storage"]) if "storage" in item else None
    except StorageConfigError as e:
        raise ServerError(f"{where}.{e}") from None
    return DevNode(item["name"], {str(k): str(v) for k, v in labels.items()},
                   parse_taints([str(t) for t in item.get("taints") or []]),
                   item.get("cpuMillicores", 0), item.get("memoryMb", 0), storage,
                   item.get("diskMb", 0), tuple(runtimes), _dev_devices(item, where))


def _dev_devices(item: dict[str, Any], where: str) -> list[Device] | None:
    """A simulated node's GPUs (`devices: [{id, vendor, model, memoryMb}]`): placement, reservation
    and explanations can be tried without the hardware (a container given one will not start on
    a host without the NVIDIA runtime, and says so)."""
    if "devices" not in item:
        return None
    raw = item["devices"] or []
    if not isinstance(raw, list) or len(raw) > MAX_NODE_DEVICES:
        raise ServerError(f"{where}.devices: a list of at most {MAX_NODE_DEVICES} devices")
    out = []
    for i, d in enumerate(raw):
        try:
            out.append(Device.model_validate(d))
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise ServerError(f"{where}.devices[{i}].{field}: {first['msg']}") from None
    return out


def dev_admin(ca: ClusterCA, folder: Path) -> TLSFiles:
    """The local user's admin identity for persysctl (`user:<login>` in persys:admins), in a folder
    of its own: the client configuration never points where the CA and server keys are."""
    login = "".join(c for c in getpass.getuser() if c.isalnum() or c in "-._@")[:63] or "admin"
    return ca.issue("user", f"user:{login}", groups=ADMIN_GROUPS, out=folder)


def dev(
    data_dir: Path = typer.Option(None, "--data-dir", help="State directory (default $PERSYS_HOME/dev)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the API listens on."),
    port: int = typer.Option(8080, "--port", help="Gateway (REST API) port."),
    scheduler_port: int = typer.Option(0, "--scheduler-port", help="Scheduler gRPC port (0 = any free port)."),
    node_id: str = typer.Option("dev-node", "--node-id", help="Name of the local node."),
    label: list[str] = typer.Option([], "--label", help="Node label key=value (repeatable)."),
    node_grace: float = typer.Option(10.0, "--node-grace", help="Seconds without heartbeat before NotReady."),
    nodes_file: Path = typer.Option(None, "--nodes", help="YAML list of local nodes to simulate "
                                    "(name, labels, taints, cpuMillicores, memoryMb, diskMb, runtimes, storage, "
                                    "devices: simulated GPUs); see examples/dev-3-nodes.yaml."),
    storage: Path = typer.Option(None, "--storage", help="The nodes' volume backends (a storage file, "
                                 "docs/storage.md) instead of the default local pool under the data dir; its "
                                 "nfs and ceph-rbd sections are also driven by the control plane (provision, "
                                 "grow, snapshot, delete)."),
    otlp_endpoint: str | None = tracing_opts.OTLP_ENDPOINT,
    intelligence_port: int = typer.Option(0, "--intelligence-grpc-port", min=-1, max=65535,
                                          help="Port of Persys Intelligence's gRPC service (persys.v1.Intelligence) "
                                          "on --host; 0: any free port, -1: off."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run scheduler, agent(s) and gateway in one process on the embedded store and event log.

    State lives in --data-dir (SQLite), so a restart finds the same cluster. Ctrl-C stops the
    control plane; running workloads are left alone and adopted again on the next start.
    """
    setup_logging(verbose)
    data = (data_dir or persys_home() / "dev").resolve()
    try:
        node_specs = dev_nodes(nodes_file) if nodes_file else [DevNode(node_id, parse_labels(label))]
        for spec in node_specs:
            check_node_id(spec.name)
        storage_config = read_storage_config(storage, allow_simulate=True)
    except ServerError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(1) from None

    async def main() -> None:
        from persys.cli.servers.signer_options import signer_from_options
        from persys.gateway.server import start_gateway
        from persys.policy import WorkloadPolicy
        from persys.policy.model import DEFAULT_NODE_PATHS
        from persys.scheduler.config import SchedulerConfig
        from persys.scheduler.rpc.server import start_scheduler

        t0 = time.monotonic()
        data.mkdir(parents=True, exist_ok=True)
        if not port_free(host, port):
            raise ServerError(f"port {port} on {host} is in use (choose another with --port)")
        ca = ClusterCA(data / "pki")
        ca.ensure()
        hosts = tuple(dict.fromkeys(("localhost", "127.0.0.1", host)))
        ids = standard_identities(ca, node_specs[0].name, hosts=hosts)
        sched_port = scheduler_port or free_port(host)
        target = f"{host}:{sched_port}"
        parts: list[Callable[[], Awaitable[None]]] = []

        async def started() -> None:
            sched = await start_scheduler(
                # Events in a bounded SQLite log: their history survives a restart, as with Redis.
                f"sqlite:///{data / 'state.db'}", f"sqlite://{data / 'events.db'}", target, ids["scheduler"],
                SchedulerConfig(node_grace_seconds=node_grace, data_dir=data / "scheduler", advertise=target),
                # The dev agents' state (and image store) lives under the data dir.
                policy_defaults=WorkloadPolicy(node_paths=[*DEFAULT_NODE_PATHS, str(data)]),
                secrets=f"builtin:{data / 'secrets.key'}",  # zero configuration: a key file made once
                meter=f"duckdb:{data / 'meter.duckdb'}",  # usage history on the in-process sample ring
                storage=storage_config,
                # More nodes may join (persysctl node token create, then persys agent --join):
                # the dev CA signs their certificates, on a join listener the kernel gives a port.
                signer_for=lambda store: signer_from_options(store, ca_dir=data / "pki"),
                join_listen=f"{host}:0",
            )
            parts.append(sched.stop)
            agents = []
            for spec in node_specs:
                agent = _dev_agent(spec, len(node_specs), data, target, host, hosts, ca, storage_config)
                await agent.start()
                parts.append(agent.stop)
                agents.append(agent)
            gw = await start_gateway(target, host, port, ids["gateway"],
                                     grpc_listen=f"{host}:{intelligence_port}" if intelligence_port >= 0 else "")
            parts.append(gw.stop)
            _one_metrics(gw, sched, agents)
            # The automation (docs/automation.md), as its own operator identity.
            parts.append(await start_dev_automation(ca, data / "automation", target))
            user = dev_admin(ca, data / "client")
            cfg_path = ClientConfig(f"https://{host}:{gw.port}", user.ca, user.cert, user.key).save()
            for agent in agents:
                await asyncio.wait_for(agent.registered.wait(), timeout=30)
            node_lines = "".join(
                f"  node:      {a.config.node_id} (runtimes: {', '.join(sorted(a.runtimes)) or 'none'})\n"
                for a in agents
            )
            print(
                f"Persys dev cluster ready in {time.monotonic() - t0:.1f}s\n"
                f"  dashboard: https://{host}:{gw.port}/  (sign in with a token: persysctl auth token create me "
                f"--role admin)\n"
                f"  API:       https://{host}:{gw.port}  (docs: /docs, OpenAPI: /openapi.json, metrics: /metrics)\n"
                f"{node_lines}"
                f"  automation: running as {AUTOMATION_USER} (persysctl automation status)\n"
                f"  join:      {host}:{sched.join_port}  (persysctl node token create; then persys agent --join)\n"
                f"  state:     {data}\n"
                f"  persysctl: configured in {cfg_path}\n"
                f"  analysis:  persysctl why NAME, insights, rightsize NAME, forecast cluster (read-only)"
                + (f"; gRPC persys.v1.Intelligence on {host}:{gw.grpc_port}\n" if gw.grpc_server else "\n") +
                "Press Ctrl-C to stop.",
                flush=True,
            )

        async def stop() -> None:
            for part in reversed(parts):
                with contextlib.suppress(Exception):
                    await part()

        await until_signalled(started, stop)

    tracing_opts.run_traced("persys-dev", otlp_endpoint, node_specs[0].name, lambda: run_main(main))


def _dev_agent(spec: DevNode, count: int, data: Path, target: str, host: str, hosts: tuple[str, ...],
               ca: ClusterCA, storage_config: StorageConfig | None) -> Agent:
    """One of the dev cluster's agents, its certificate from the dev CA, its state under --data-dir."""
    from persys.agent.agent import Agent, AgentConfig

    # One node keeps the historical state dir; more nodes get one each.
    state = data / "agent" if count == 1 else data / "agents" / spec.name
    return Agent(
        AgentConfig(node_id=spec.name, scheduler=target, state_dir=state, listen=f"{host}:0",
                    tls=ca.issue(f"node-{spec.name}", f"node:{spec.name}", hosts),
                    labels=spec.labels, taints=spec.taints,
                    cpu_millicores=spec.cpu_millicores, memory_mb=spec.memory_mb, disk_mb=spec.disk_mb,
                    devices=spec.devices,
                    # Embedded default: local volumes in a pool under the node's folder.
                    storage=spec.storage or storage_config
                    or StorageConfig(local=LocalConfig(str(state / "volumes"))),
                    cluster_id=cluster_id_of_file(ca.ca_cert_path)),
        # As the policy defaults; the cluster id from the data dir's CA (a second
        # `persys dev` elsewhere is another cluster on the same engine).
        [r for r in default_runtimes(state, spec.name, allow_node_paths=[data],
                                     cluster_id=cluster_id_of_file(ca.ca_cert_path))
         if not spec.runtimes or r.name in spec.runtimes],
    )


def _one_metrics(gw: RunningGateway, sched: RunningScheduler, agents: list[Agent]) -> None:
    """One /metrics for the whole all-in-one: the scheduler's and each agent's series beside the
    gateway's (a production cluster scrapes each process on its own listener)."""
    if sched.metrics is not None:
        gw.metrics.include(sched.metrics)
    for agent in agents:
        gw.metrics.include(agent.meter.metrics, {"node": agent.config.node_id})
