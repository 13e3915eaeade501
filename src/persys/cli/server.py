"""`persys`: run the Persys servers (all-in-one dev cluster, scheduler, agent, gateway).

Over 500 lines because typer declares every option in the command's signature: the four
commands are mostly their options (certificates, Vault, backends, join). Next to split: `dev`
into its own module with the helpers it shares with `agent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import typer
import yaml

from persys.cli import backend_opts, tracing_opts
from persys.cli import identity_options as idopt
from persys.cli.certs_cmds import certs_app
from persys.cli.config import ClientConfig, persys_home
from persys.cli.server_errors import ServerError
from persys.cli.version import version_option
from persys.meter.config import HELP as METER_HELP
from persys.meter.config import check_spec
from persys.meter.query import Retention, parse_retention
from persys.model import Taint
from persys.model.limits import BATCH_MAX_BYTES, IMAGE_MAX_BYTES, MANIFEST_MAX_BYTES, RESTORE_MAX_BYTES, GatewayLimits
from persys.model.node_names import node_id_problem
from persys.secrets.base import SecretStoreError
from persys.security.pki import ADMIN_GROUPS, ClusterCA, standard_identities
from persys.tlsfiles import TLSFiles

if TYPE_CHECKING:
    from persys.agent.runtimes.base import Runtime
    from persys.observability.metrics_http import MetricsServer

# Each command imports its servers in its body: an agent process never loads the gateway's web
# stack or the scheduler, a scheduler never loads the runtimes' clients (about 1 s per start).

app = typer.Typer(
    name="persys",
    help=(
        "Run Persys servers.\n\n"
        "  persys dev         all-in-one cluster on embedded defaults (no servers needed)\n\n"
        "  persys scheduler   a scheduler replica (etcd + Redis in production)\n\n"
        "  persys agent       the node agent\n\n"
        "  persys gateway     the REST gateway\n\n"
        "  persys certs init  a cluster CA and certificates for the components\n\n"
        "  persys certs issue one machine's certificate, into its own folder\n\n"
        "  persys certs vault-setup  OpenBao/Vault for --identity-from openbao\n\n"
        "  persys certs status  every identity and its certificate's expiry"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(certs_app, name="certs")


@app.callback()
def _root(_version: bool = version_option("persys")) -> None:
    """Run Persys servers."""

log = logging.getLogger("persys")

METRICS_LISTEN_HELP = ("Serve Prometheus metrics at https://HOST:PORT/metrics: a client certificate from the cluster "
                       "CA is required, with the `get metrics` right (viewer and up; e.g. `persys certs issue --role "
                       "user --name prometheus --group persys:viewers`). Port 0 picks a free one (printed).")
METRICS_PLAIN_HELP = ("Also serve /metrics over plain HTTP at HOST:PORT, without authentication: only where you "
                      "want it, e.g. 127.0.0.1:9464 for a Prometheus on this host. Port 0 picks a free one.")


def _metrics_lines(servers: Sequence[MetricsServer], who: str, host_of: Callable[[str], str]) -> str:
    """The ready lines of the metrics listeners (the bound ports, also for port 0)."""
    return "".join(f"{who} metrics on {m.scheme}://{host_of(m.scheme)}:{m.port}/metrics\n" for m in servers)


def _check_listen(value: str, option: str) -> None:
    if not value:
        return
    from persys.observability.metrics_http import parse_listen

    try:
        parse_listen(value, option)
    except ValueError as e:
        raise ServerError(str(e)) from None


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    for noisy in ("aiodocker", "asyncio", "uvicorn.error", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _parse_labels(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ServerError(f"label {item!r} must look like key=value")
        out[k] = v
    return out


def _parse_taints(items: list[str]) -> list[Taint]:
    taints = []
    for item in items:
        kv, _, effect = item.partition(":")
        k, _, v = kv.partition("=")
        if not k or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ServerError(f"taint {item!r} must look like key=value:NoSchedule|PreferNoSchedule|NoExecute")
        taints.append(Taint(key=k, value=v, effect=effect))  # type: ignore[arg-type]
    return taints


@dataclass
class DevNode:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    cpu_millicores: int = 0
    memory_mb: int = 0


def _dev_nodes(path: Path) -> list[DevNode]:
    """Nodes for `persys dev --nodes FILE`: a YAML list of {name, labels, taints, cpuMillicores, memoryMb}."""
    if not path.exists():
        raise ServerError(f"{path}: no such file")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ServerError(f"{path}: not valid YAML ({e})") from None
    items = doc.get("nodes") if isinstance(doc, dict) else doc
    if not isinstance(items, list) or not items:
        raise ServerError(f"{path}: expected a list of nodes (or a mapping with `nodes:`)")
    out = []
    known = {"name", "labels", "taints", "cpuMillicores", "memoryMb"}
    for i, item in enumerate(items):
        where = f"{path}: nodes[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ServerError(f"{where}.name: required")
        unknown = set(item) - known
        if unknown:
            raise ServerError(f"{where}.{sorted(unknown)[0]}: unknown field")
        for num in ("cpuMillicores", "memoryMb"):
            if not isinstance(item.get(num, 0), int) or item.get(num, 0) < 0:
                raise ServerError(f"{where}.{num}: must be a non-negative integer")
        labels = item.get("labels") or {}
        if not isinstance(labels, dict):
            raise ServerError(f"{where}.labels: must be a mapping")
        out.append(DevNode(item["name"], {str(k): str(v) for k, v in labels.items()},
                           _parse_taints([str(t) for t in item.get("taints") or []]),
                           item.get("cpuMillicores", 0), item.get("memoryMb", 0)))
    if len({n.name for n in out}) != len(out):
        raise ServerError(f"{path}: node names must be unique")
    return out


def dev_admin(ca: ClusterCA, folder: Path) -> TLSFiles:
    """The local user's admin identity for persysctl (`user:<login>` in persys:admins), in a folder
    of its own: the client configuration never points where the CA and server keys are."""
    login = "".join(c for c in getpass.getuser() if c.isalnum() or c in "-._@")[:63] or "admin"
    return ca.issue("user", f"user:{login}", groups=ADMIN_GROUPS, out=folder)


def _check_node_id(node_id: str) -> None:
    """Refuse at start what the scheduler would refuse at registration."""
    problem = node_id_problem(node_id)
    if problem:
        raise ServerError(f"--node-id: {problem}")


def _tls_from_dir(directory: Path, name: str) -> TLSFiles:
    files = TLSFiles(directory / "ca.crt", directory / f"{name}.crt", directory / f"{name}.key")
    for f in (files.ca, files.cert, files.key):
        if not f.exists():
            raise ServerError(f"{f} is missing (create certificates with `persys certs init --dir {directory}`)")
    return files


def default_runtimes(state_dir: Path, node_id: str, workload_user: str = "nobody",
                     allow_node_paths: Sequence[Path] = ()) -> list[Runtime]:
    from persys.agent.runtimes.compose import ComposeRuntime
    from persys.agent.runtimes.docker import DockerRuntime
    from persys.agent.runtimes.microvm.runtime import MicroVMRuntime
    from persys.agent.runtimes.node_paths import NodePaths
    from persys.agent.runtimes.process import ProcessRuntime
    from persys.agent.runtimes.secret_files import secrets_root
    from persys.agent.runtimes.vm import LibvirtVMRuntime

    # Containers carry their node's name, so agents sharing one engine (tests, several
    # nodes on one host) never adopt or remove each other's containers.
    scope = {"persys.node": node_id}
    # Node paths workloads may name, re-checked here whatever the scheduler admitted.
    paths = NodePaths.for_agent(state_dir, allow_node_paths)
    return [
        DockerRuntime(extra_labels=scope, secrets_dir=secrets_root(state_dir / "runtimes" / "container-secrets",
                                                                   state_dir / "runtimes" / "container")),
        ComposeRuntime(state_dir / "runtimes", extra_labels=scope, node_paths=paths),
        LibvirtVMRuntime(state_dir / "runtimes", extra_labels=scope, node_paths=paths),
        MicroVMRuntime(state_dir / "runtimes", node_paths=paths),
        ProcessRuntime(state_dir / "runtimes", agent_id=node_id, workload_user=workload_user),
    ]


async def _until_signalled(started: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]) -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    try:
        await started()
        await done.wait()
    finally:
        print("\nstopping ...", file=sys.stderr, flush=True)
        await stop()


def _run(coro: Callable[[], Awaitable[None]]) -> None:
    from persys.observability.metrics_http import MetricsListenError

    try:
        asyncio.run(coro())  # type: ignore[arg-type]
    except (ServerError, SecretStoreError, MetricsListenError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


# --------------------------------------------------------------------------- persys dev


@app.command()
def dev(
    data_dir: Path = typer.Option(None, "--data-dir", help="State directory (default $PERSYS_HOME/dev)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the API listens on."),
    port: int = typer.Option(8080, "--port", help="Gateway (REST API) port."),
    scheduler_port: int = typer.Option(0, "--scheduler-port", help="Scheduler gRPC port (0 = any free port)."),
    node_id: str = typer.Option("dev-node", "--node-id", help="Name of the local node."),
    label: list[str] = typer.Option([], "--label", help="Node label key=value (repeatable)."),
    node_grace: float = typer.Option(10.0, "--node-grace", help="Seconds without heartbeat before NotReady."),
    nodes_file: Path = typer.Option(None, "--nodes", help="YAML list of local nodes to simulate "
                                    "(name, labels, taints, cpuMillicores, memoryMb); see examples/dev-3-nodes.yaml."),
    otlp_endpoint: str | None = tracing_opts.OTLP_ENDPOINT,
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run scheduler, agent(s) and gateway in one process on the embedded store and event log.

    State lives in --data-dir (SQLite), so a restart finds the same cluster. Ctrl-C stops the
    control plane; running workloads are left alone and adopted again on the next start.
    """
    _setup_logging(verbose)
    data = (data_dir or persys_home() / "dev").resolve()
    try:
        node_specs = _dev_nodes(nodes_file) if nodes_file else [DevNode(node_id, _parse_labels(label))]
        for spec in node_specs:
            _check_node_id(spec.name)
    except ServerError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(1) from None

    async def main() -> None:
        from persys.agent.agent import Agent, AgentConfig
        from persys.gateway.server import start_gateway
        from persys.policy import WorkloadPolicy
        from persys.policy.model import DEFAULT_NODE_PATHS
        from persys.scheduler.config import SchedulerConfig
        from persys.scheduler.server import start_scheduler

        t0 = time.monotonic()
        data.mkdir(parents=True, exist_ok=True)
        if not _port_free(host, port):
            raise ServerError(f"port {port} on {host} is in use (choose another with --port)")
        ca = ClusterCA(data / "pki")
        ca.ensure()
        hosts = tuple(dict.fromkeys(("localhost", "127.0.0.1", host)))
        ids = standard_identities(ca, node_specs[0].name, hosts=hosts)
        sched_port = scheduler_port or _free_port(host)
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
            )
            parts.append(sched.stop)
            agents = []
            for spec in node_specs:
                # One node keeps the historical state dir; more nodes get one each.
                state = data / "agent" if len(node_specs) == 1 else data / "agents" / spec.name
                agent = Agent(
                    AgentConfig(node_id=spec.name, scheduler=target, state_dir=state, listen=f"{host}:0",
                                tls=ca.issue(f"node-{spec.name}", f"node:{spec.name}", hosts),
                                labels=spec.labels, taints=spec.taints,
                                cpu_millicores=spec.cpu_millicores, memory_mb=spec.memory_mb),
                    default_runtimes(state, spec.name, allow_node_paths=[data]),  # as the policy defaults
                )
                await agent.start()
                parts.append(agent.stop)
                agents.append(agent)
            gw = await start_gateway(target, host, port, ids["gateway"])
            parts.append(gw.stop)
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
                f"  API:       https://{host}:{gw.port}  (docs: /docs, OpenAPI: /openapi.json, metrics: /metrics)\n"
                f"{node_lines}"
                f"  state:     {data}\n"
                f"  persysctl: configured in {cfg_path}\n"
                f"Press Ctrl-C to stop.",
                flush=True,
            )

        async def stop() -> None:
            for part in reversed(parts):
                with contextlib.suppress(Exception):
                    await part()

        await _until_signalled(started, stop)

    tracing_opts.run_traced("persys-dev", otlp_endpoint, node_specs[0].name, lambda: _run(main))


# --------------------------------------------------------------------------- separate servers


def _meter_options(spec: str, retention: str, events: str) -> Retention:
    """--meter and --meter-retention checked before anything starts: one line naming the option."""
    try:
        check_spec(spec)
        if spec == "publish" and events.startswith("memory:"):
            raise ValueError("--meter publish: samples reach another replica's meter only over Redis (--events)")
        return parse_retention(retention)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None


@app.command(help=backend_opts.SCHEDULER_HELP)
def scheduler(
    listen: str = typer.Option("0.0.0.0:7443", "--listen", help="gRPC address."),
    store: str = typer.Option(..., "--store", help="etcd://host:port[,host:port], etcds://... (TLS) or "
                              "sqlite:///path.db. No password in the URL: see --etcd-user."),
    events: str = typer.Option("memory://", "--events", help="redis://host:port/0, rediss://[user@]host:port/0 "
                               "(TLS), unix:///path.sock?db=0, sqlite:///path/events.db (one replica only: a "
                               "durable, bounded log in a file) or memory://. No password in the URL."),
    tls_dir: Path = typer.Option(None, "--tls-dir", help="Directory with ca.crt, scheduler.crt, scheduler.key "
                                 "(with --identity-from files, the default)."),
    node_grace: float = typer.Option(10.0, "--node-grace", help="Seconds without heartbeat before NotReady."),
    nodes_to_score: int = typer.Option(2, "--nodes-to-score-percent", min=1, max=100,
                                       help="Stop filtering once max(100, this % of nodes) fit; 100 = all."),
    data_dir: Path = typer.Option(Path("/var/lib/persys/scheduler"), "--data-dir",
                                  help="Remembers the cluster id (to recognise a wiped store) and rolling backups."),
    replica_id: str = typer.Option("", "--replica-id", help="Unique name of this replica (default: random)."),
    sharded: bool = typer.Option(False, "--sharded", help="Active-active: spread nodes over all live replicas "
                                 "(rendezvous hashing); placement stays with the elected leader."),
    advertise: str = typer.Option("", "--advertise", help="host:port agents use to reach this replica "
                                  "(default: --listen, or this host's name when listening on 0.0.0.0)."),
    stall_log_ms: float = typer.Option(0.0, "--stall-log-ms", min=0,
                                       help="Log the stack of whatever holds the event loop longer than this many "
                                       "milliseconds (diagnostics; costs a little CPU; 0 = off)."),
    liveness_suspension: float | None = typer.Option(
        None, "--liveness-suspension", min=0, help="When more than half of the nodes go silent at once, liveness "
        "is suspended (nobody marked NotReady) for at most this many seconds (default: six --node-grace "
        "periods); 0 = never suspend."),
    liveness_guard_min_nodes: int = typer.Option(
        10, "--liveness-guard-min-nodes", min=1, help="The mass-loss guard applies from this many nodes on."),
    max_manifest_bytes: int = typer.Option(MANIFEST_MAX_BYTES, "--max-manifest-bytes", min=1024,
                                           help="Largest manifest (its JSON) a client may apply; larger ones are "
                                           "refused before parsing. Stored workloads must also fit one store write "
                                           "(etcd's --max-request-bytes, 1.5 MiB by default)."),
    node_simulator: list[str] = typer.Option(
        [], "--node-simulator", help="Certificate identity (e.g. user:admin) allowed to act for any node: "
        "benchmarks' hollow agents only; never in production (repeatable)."),
    identity_from: str = idopt.IDENTITY_FROM, vault_addr: str = idopt.VAULT_ADDR,
    vault_ca_file: Path = idopt.VAULT_CA_FILE, vault_role_id_file: Path = idopt.VAULT_ROLE_ID_FILE,
    vault_secret_id_file: Path = idopt.VAULT_SECRET_ID_FILE, vault_pki_mount: str = idopt.VAULT_PKI_MOUNT,
    vault_approle_mount: str = idopt.VAULT_APPROLE_MOUNT, cert_ttl: int = idopt.CERT_TTL,
    cert_host: list[str] = idopt.CERT_HOST, runtime_dir: Path = idopt.RUNTIME_DIR,
    secrets: str = typer.Option(
        "builtin", "--secrets", metavar="builtin[:KEYFILE]|openbao",
        help="Where secrets live. builtin: encrypted (AES-GCM) in the state store under a master key file "
        "(default DATA_DIR/secrets.key, created 0600; every replica needs the same file). openbao (or vault): "
        "KV v2 at $PERSYS_BAO_ADDR, mount $PERSYS_BAO_MOUNT (secret), credentials from files only: "
        "$PERSYS_BAO_TOKEN_FILE, or $PERSYS_BAO_ROLE_ID_FILE + $PERSYS_BAO_SECRET_ID_FILE (AppRole)."),
    etcd_ca: Path | None = backend_opts.ETCD_CA,
    etcd_cert: Path | None = backend_opts.ETCD_CERT,
    etcd_key: Path | None = backend_opts.ETCD_KEY,
    etcd_server_name: str | None = backend_opts.ETCD_SERVER_NAME,
    etcd_user: str | None = backend_opts.ETCD_USER,
    etcd_password: str | None = backend_opts.ETCD_PASSWORD,
    etcd_password_file: Path | None = backend_opts.ETCD_PASSWORD_FILE,
    redis_ca: Path | None = backend_opts.REDIS_CA,
    redis_cert: Path | None = backend_opts.REDIS_CERT,
    redis_key: Path | None = backend_opts.REDIS_KEY,
    redis_user: str | None = backend_opts.REDIS_USER,
    redis_password: str | None = backend_opts.REDIS_PASSWORD,
    redis_password_file: Path | None = backend_opts.REDIS_PASSWORD_FILE,
    ca_dir: Path = typer.Option(None, "--ca-dir", help="Sign node certificates (join and renewal) with the "
                                "built-in CA in this folder (ca.crt, ca.key; `persys certs init`); with "
                                "--identity-from openbao they are signed by OpenBao."),
    join_listen: str = typer.Option("", "--join-listen", help="Where nodes without a certificate join with a "
                                    "token (server-only TLS, serving nothing else), e.g. 0.0.0.0:7444. "
                                    "Needs a signer: --ca-dir or --identity-from openbao."),
    node_cert_ttl: float = typer.Option(12 * 3600.0, "--node-cert-ttl", help="Lifetime of the node certificates "
                                        "this replica signs, in seconds; nodes renew at two thirds of it."),
    metrics_listen: str = typer.Option("", "--metrics-listen", metavar="HOST:PORT", help=METRICS_LISTEN_HELP),
    metrics_plain_listen: str = typer.Option("", "--metrics-plain-listen", metavar="HOST:PORT",
                                             help=METRICS_PLAIN_HELP),
    metrics: bool = typer.Option(True, "--metrics/--no-metrics", help="Count gRPC calls and store operations "
                                 "(--no-metrics: neither is wrapped, nothing is served; to measure their cost)."),
    otlp_endpoint: str | None = tracing_opts.OTLP_ENDPOINT,
    meter: str = typer.Option("off", "--meter", metavar="duckdb[:PATH]|clickhouse://...|chdb:PATH|off",
                              help=METER_HELP),
    meter_retention: str = typer.Option("raw=1d,1m=30d,1h=365d", "--meter-retention",
                                        help="How long Persys Meter keeps raw samples and its 1-minute and "
                                        "hourly rollups."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run a scheduler replica (its certificate from --tls-dir, or from OpenBao/Vault with
    --identity-from openbao, renewed while it runs)."""
    _setup_logging(verbose)
    vault = idopt.VaultIdentityOptions(vault_addr, vault_ca_file, vault_role_id_file, vault_secret_id_file,
                                       vault_pki_mount, vault_approle_mount, cert_ttl, tuple(cert_host), runtime_dir)
    retention = _meter_options(meter, meter_retention, events)

    async def main() -> None:
        from persys.cli.join_setup import scheduler_signer
        from persys.scheduler.admission import InputLimits
        from persys.scheduler.config import SchedulerConfig
        from persys.scheduler.server import start_scheduler
        from persys.security.grpc_reload import reloading_server_credentials

        idopt.check_source(identity_from, tls_dir)
        _check_listen(metrics_listen, "--metrics-listen")
        _check_listen(metrics_plain_listen, "--metrics-plain-listen")
        if not metrics and (metrics_listen or metrics_plain_listen):
            raise ServerError("--no-metrics: nothing to serve on --metrics-listen / --metrics-plain-listen")
        live = await idopt.start_identity(vault, "scheduler", replica_id) if identity_from == "openbao" else None
        tls = live.files if live else _tls_from_dir(tls_dir, "scheduler")
        creds = reloading_server_credentials(lambda: live.current) if live else None
        s_access, e_access = backend_opts.accesses(
            store, events, tls, (etcd_ca, etcd_cert, etcd_key, etcd_server_name, etcd_user, etcd_password,
                                 etcd_password_file), (redis_ca, redis_cert, redis_key, redis_user, redis_password,
                                                       redis_password_file))
        signer_for = scheduler_signer(ca_dir, live, join_listen, node_cert_ttl)
        holder = []

        async def started() -> None:
            host, _, port = listen.rpartition(":")
            adv = advertise or (f"{socket.gethostname()}:{port}" if host in ("0.0.0.0", "[::]", "") else listen)
            with backend_opts.refusals():  # a wrong password: one line, no traceback
                s = await start_scheduler(store, events, listen, tls, SchedulerConfig(
                    node_grace_seconds=node_grace, nodes_to_score_percent=nodes_to_score, data_dir=data_dir,
                    replica_id=replica_id, advertise=adv, sharded=sharded, stall_log_seconds=stall_log_ms / 1000,
                    liveness_suspension_seconds=liveness_suspension,
                    liveness_guard_min_nodes=liveness_guard_min_nodes),
                    limits=InputLimits(max_manifest_bytes=max_manifest_bytes),
                    node_simulators=frozenset(node_simulator), store_access=s_access, events_access=e_access,
                    credentials=creds, secrets=secrets, signer_for=signer_for, join_listen=join_listen,
                    node_cert_ttl=node_cert_ttl, metrics_listen=metrics_listen,
                    metrics_plain_listen=metrics_plain_listen, metrics=metrics, meter=meter,
                    meter_retention=retention)
            holder.append(s)
            if live:
                await idopt.track_in_registry(s.store, live)
            hosts = {"https": metrics_listen.rpartition(":")[0], "http": metrics_plain_listen.rpartition(":")[0]}
            print(f"scheduler ready on port {s.port}" + (f", join port {s.join_port}" if s.join_port else "")
                  + "\n" + _metrics_lines(s.metrics_servers, "scheduler", hosts.__getitem__), end="", flush=True)

        async def stop() -> None:
            for s in holder:
                await s.stop()
            if live:
                await live.stop()

        await _until_signalled(started, stop)

    tracing_opts.run_traced("persys-scheduler", otlp_endpoint, replica_id, lambda: _run(main))


@app.command()
def agent(
    scheduler_addr: str = typer.Option(..., "--scheduler", help="Scheduler gRPC address host:port."),
    node_id: str = typer.Option(socket.gethostname(), "--node-id", help="This node's name."),
    tls_dir: Path = typer.Option(..., "--tls-dir", help="Directory with ca.crt and node-<id>.crt/.key (written "
                                 "there by --join)."),
    join_address: str = typer.Option("", "--join", help="Join first, if the TLS folder holds no valid "
                                     "certificate: the scheduler's join listener host:port (--join-listen)."),
    token: str = typer.Option("", "--token", help="The join token (persysctl node token create); or "
                              "$PERSYS_JOIN_TOKEN, which stays out of the process list. Used once."),
    ca_pin: str = typer.Option("", "--ca-pin", help="sha256:<hex> printed with the token: the join proceeds "
                               "only with a scheduler whose CA matches it."),
    renew: bool = typer.Option(True, "--renew/--no-renew", help="Renew the node certificate at two thirds of "
                               "its lifetime, from the scheduler (which needs --ca-dir)."),
    state_dir: Path = typer.Option(Path("/var/lib/persys/agent"), "--state-dir"),
    label: list[str] = typer.Option([], "--label", help="Node label key=value (repeatable)."),
    taint: list[str] = typer.Option([], "--taint", help="Node taint key=value:Effect (repeatable)."),
    cpu_millicores: int = typer.Option(0, "--cpu-millicores", help="Advertised CPU (0 = measure)."),
    memory_mb: int = typer.Option(0, "--memory-mb", help="Advertised memory (0 = measure)."),
    listen: str = typer.Option("0.0.0.0:0", "--listen", help="Where the agent serves logs to the control plane "
                               "(mutual TLS); port 0 picks a free one."),
    advertise_host: str = typer.Option("", "--advertise-host", help="Host the control plane dials (default: "
                                       "the --listen host, or this host's name for 0.0.0.0)."),
    max_image_bytes: int = typer.Option(IMAGE_MAX_BYTES, "--max-image-bytes", min=1,
                                        help="Largest image upload accepted (streamed to disk, refused past this)."),
    workload_user: str = typer.Option("nobody", "--workload-user",
                                      help="Who runs process workloads that name no user (the agent must be root)."),
    allow_node_path: list[Path] = typer.Option([], "--allow-node-path", help="A directory besides the state dir "
                                               "and /var/lib/persys whose files workloads may name (repeatable)."),
    metrics_listen: str = typer.Option("", "--metrics-listen", metavar="HOST:PORT", help=METRICS_LISTEN_HELP),
    metrics_plain_listen: str = typer.Option("", "--metrics-plain-listen", metavar="HOST:PORT",
                                             help=METRICS_PLAIN_HELP),
    otlp_endpoint: str | None = tracing_opts.OTLP_ENDPOINT,
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the node agent."""
    _setup_logging(verbose)

    async def main() -> None:
        from persys.agent.agent import Agent, AgentConfig
        from persys.cli.join_setup import agent_tls, certificate_hosts

        _check_node_id(node_id)
        _check_listen(metrics_listen, "--metrics-listen")
        _check_listen(metrics_plain_listen, "--metrics-plain-listen")
        tls = await agent_tls(tls_dir, node_id, join_address, token, ca_pin,
                              certificate_hosts(listen, advertise_host))
        a = Agent(
            AgentConfig(node_id=node_id, scheduler=scheduler_addr, tls=tls, state_dir=state_dir,
                        labels=_parse_labels(label), taints=_parse_taints(taint),
                        cpu_millicores=cpu_millicores, memory_mb=memory_mb, listen=listen,
                        advertise_host=advertise_host, image_max_bytes=max_image_bytes, renew_certificate=renew,
                        metrics_listen=metrics_listen, metrics_plain_listen=metrics_plain_listen),
            default_runtimes(state_dir, node_id, workload_user, allow_node_path),
        )

        async def started() -> None:
            await a.start()
            hosts = {"https": metrics_listen.rpartition(":")[0], "http": metrics_plain_listen.rpartition(":")[0]}
            print(f"agent {node_id} started (runtimes: {', '.join(sorted(a.runtimes)) or 'none'})\n"
                  + _metrics_lines(a.metrics_servers, "agent", hosts.__getitem__), end="", flush=True)

        await _until_signalled(started, a.stop)

    tracing_opts.run_traced("persys-agent", otlp_endpoint, node_id, lambda: _run(main))


@app.command()
def gateway(
    scheduler_addr: str = typer.Option(..., "--scheduler", help="Scheduler gRPC address host:port."),
    listen: str = typer.Option("127.0.0.1:8080", "--listen", help="HTTPS address host:port."),
    tls_dir: Path = typer.Option(None, "--tls-dir", help="Directory with ca.crt, gateway.crt, gateway.key "
                                 "(with --identity-from files, the default)."),
    max_manifest_bytes: int = typer.Option(MANIFEST_MAX_BYTES, "--max-manifest-bytes", min=1,
                                           help="Largest manifest body (apply, plan); the scheduler's own limit is "
                                           "the default."),
    max_batch_bytes: int = typer.Option(BATCH_MAX_BYTES, "--max-batch-bytes", min=1,
                                        help="Largest bulk-apply body."),
    max_restore_bytes: int = typer.Option(RESTORE_MAX_BYTES, "--max-restore-bytes", min=1,
                                          help="Largest backup body to restore."),
    max_image_bytes: int = typer.Option(IMAGE_MAX_BYTES, "--max-image-bytes", min=1,
                                        help="Largest image upload (streamed to the node, never held in memory)."),
    identity_from: str = idopt.IDENTITY_FROM, vault_addr: str = idopt.VAULT_ADDR,
    vault_ca_file: Path = idopt.VAULT_CA_FILE, vault_role_id_file: Path = idopt.VAULT_ROLE_ID_FILE,
    vault_secret_id_file: Path = idopt.VAULT_SECRET_ID_FILE, vault_pki_mount: str = idopt.VAULT_PKI_MOUNT,
    vault_approle_mount: str = idopt.VAULT_APPROLE_MOUNT, cert_ttl: int = idopt.CERT_TTL,
    cert_host: list[str] = idopt.CERT_HOST, runtime_dir: Path = idopt.RUNTIME_DIR,
    otlp_endpoint: str | None = tracing_opts.OTLP_ENDPOINT,
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the REST gateway (its certificate from --tls-dir, or from OpenBao/Vault with
    --identity-from openbao, renewed while it runs)."""
    _setup_logging(verbose)
    host, _, port_s = listen.rpartition(":")
    vault = idopt.VaultIdentityOptions(vault_addr, vault_ca_file, vault_role_id_file, vault_secret_id_file,
                                       vault_pki_mount, vault_approle_mount, cert_ttl, tuple(cert_host), runtime_dir)

    async def main() -> None:
        from persys.gateway.server import start_gateway

        idopt.check_source(identity_from, tls_dir)
        if not port_s.isdigit():
            raise ServerError(f"--listen {listen!r} must be host:port")
        if not _port_free(host, int(port_s)):
            raise ServerError(f"port {port_s} on {host} is in use")
        live = await idopt.start_identity(vault, "gateway") if identity_from == "openbao" else None
        tls = live.files if live else _tls_from_dir(tls_dir, "gateway")
        holder = []

        async def started() -> None:
            limits = GatewayLimits(manifest_bytes=max_manifest_bytes, batch_bytes=max_batch_bytes,
                                   restore_bytes=max_restore_bytes, image_bytes=max_image_bytes)
            gw = await start_gateway(scheduler_addr, host, int(port_s), tls, limits)
            holder.append(gw)
            if live:
                live.on_change(lambda _m: gw.reload_tls())
            print(f"gateway ready on https://{host}:{gw.port} (metrics: https://{host}:{gw.port}/metrics)", flush=True)

        async def stop() -> None:
            for gw in holder:
                await gw.stop()
            if live:
                await live.stop()

        await _until_signalled(started, stop)

    tracing_opts.run_traced("persys-gateway", otlp_endpoint, "", lambda: _run(main))


def main() -> None:
    try:
        app()
    except ServerError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
