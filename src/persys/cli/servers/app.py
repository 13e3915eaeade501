"""`persys`: run the Persys servers: `dev` (cli/servers/dev_cmd.py), `scheduler`, `agent`, `gateway`
and `certs` (cli/servers/certs_cmds.py). Most of each command is its options: typer declares them in the
signature. What the commands share lives in cli/servers/common.py."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from persys.cli.servers import backend_opts, tracing_opts
from persys.cli.servers import identity_options as idopt
from persys.cli.servers.automation import automation
from persys.cli.servers.certs_cmds import certs_app
from persys.cli.servers.common import (
    METRICS_LISTEN_HELP,
    METRICS_PLAIN_HELP,
    check_listen,
    check_node_id,
    check_registry_auth,
    check_rgw_key,
    default_runtimes,
    metrics_lines,
    parse_labels,
    parse_process_uids,
    parse_taints,
    port_free,
    read_storage_config,
    run_main,
    setup_logging,
    tls_from_dir,
    until_signalled,
)
from persys.cli.servers.dev_cmd import dev
from persys.cli.servers.errors import ServerError
from persys.cli.version import version_option
from persys.meter.config import HELP as METER_HELP
from persys.meter.config import check_spec
from persys.meter.query import Retention, parse_retention
from persys.model.limits import BATCH_MAX_BYTES, IMAGE_MAX_BYTES, MANIFEST_MAX_BYTES, RESTORE_MAX_BYTES, GatewayLimits
from persys.security import private_files

if TYPE_CHECKING:
    pass

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


app.command()(dev)
app.command(name="automation")(automation)


@app.callback()
def _root(_version: bool = version_option("persys")) -> None:
    """Run Persys servers."""

log = logging.getLogger("persys")

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
    load_aware_weight: float = typer.Option(0.0, "--load-aware-weight", min=0.0, max=100.0,
                                            help="Weight of load-aware scoring (nodes' recent p95 cpu and memory "
                                            "from heartbeats) beside the request-based scores (headroom 1, spread "
                                            "2); 0 = off. Requests stay the fit rule."),
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
    restart_grace: float | None = typer.Option(
        None, "--restart-grace", min=0, help="After this replica starts or is elected, a node it has not heard from "
        "yet keeps its stored status this many seconds: nothing is placed on it or moved off it, so an agent "
        "returning within it keeps its workloads (default: six --node-grace periods; never less than one)."),
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
    storage: Path | None = typer.Option(None, "--storage", help="Network volume backends the active replica "
                                        "provisions, grows and deletes volumes on: the `nfs` and `ceph-rbd` "
                                        "sections of a storage file (docs/storage.md; `local` volumes are the "
                                        "nodes')."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run a scheduler replica (its certificate from --tls-dir, or from OpenBao/Vault with
    --identity-from openbao, renewed while it runs)."""
    setup_logging(verbose)
    vault = idopt.VaultIdentityOptions(vault_addr, vault_ca_file, vault_role_id_file, vault_secret_id_file,
                                       vault_pki_mount, vault_approle_mount, cert_ttl, tuple(cert_host), runtime_dir)
    retention = _meter_options(meter, meter_retention, events)

    async def main() -> None:
        from persys.cli.servers.join_setup import scheduler_signer
        from persys.scheduler.access.admission import InputLimits
        from persys.scheduler.config import SchedulerConfig
        from persys.scheduler.rpc.server import start_scheduler
        from persys.security.grpc_reload import reloading_server_credentials

        idopt.check_source(identity_from, tls_dir)
        # Its state and logs its own: 0600 in 0700 (issue #30); an agent's folder inside it is left alone.
        private_files.tighten_tree(data_dir, max_depth=4, leave="agent.db")
        storage_config = read_storage_config(storage)
        check_rgw_key(storage, storage_config)
        check_listen(metrics_listen, "--metrics-listen")
        check_listen(metrics_plain_listen, "--metrics-plain-listen")
        if not metrics and (metrics_listen or metrics_plain_listen):
            raise ServerError("--no-metrics: nothing to serve on --metrics-listen / --metrics-plain-listen")
        live = await idopt.start_identity(vault, "scheduler", replica_id) if identity_from == "openbao" else None
        tls = live.files if live else tls_from_dir(tls_dir, "scheduler")
        creds = reloading_server_credentials(lambda: live.current) if live else None
        s_access, e_access = backend_opts.accesses(
            store, events, tls, (etcd_ca, etcd_cert, etcd_key, etcd_server_name, etcd_user, etcd_password,
                                 etcd_password_file), (redis_ca, redis_cert, redis_key, redis_user, redis_password,
                                                       redis_password_file))
        signer_for = scheduler_signer(ca_dir, live, join_listen, node_cert_ttl)
        holder = []
        from persys.scheduler.replica.backend_probe import open_access_warnings

        for warning in await open_access_warnings(store, events, s_access, e_access):  # issue #30: said at start
            log.warning("%s", warning)

        async def started() -> None:
            host, _, port = listen.rpartition(":")
            adv = advertise or (f"{socket.gethostname()}:{port}" if host in ("0.0.0.0", "[::]", "") else listen)
            with backend_opts.refusals():  # a wrong password: one line, no traceback
                s = await start_scheduler(store, events, listen, tls, SchedulerConfig(
                    node_grace_seconds=node_grace, nodes_to_score_percent=nodes_to_score, data_dir=data_dir,
                    load_aware_weight=load_aware_weight,
                    replica_id=replica_id, advertise=adv, sharded=sharded, stall_log_seconds=stall_log_ms / 1000,
                    liveness_suspension_seconds=liveness_suspension, restart_grace_seconds=restart_grace,
                    liveness_guard_min_nodes=liveness_guard_min_nodes),
                    limits=InputLimits(max_manifest_bytes=max_manifest_bytes),
                    node_simulators=frozenset(node_simulator), store_access=s_access, events_access=e_access,
                    credentials=creds, secrets=secrets, signer_for=signer_for, join_listen=join_listen,
                    node_cert_ttl=node_cert_ttl, metrics_listen=metrics_listen,
                    metrics_plain_listen=metrics_plain_listen, metrics=metrics, meter=meter,
                    meter_retention=retention, storage=storage_config)
            holder.append(s)
            if live:
                await idopt.track_in_registry(s.store, live)
            hosts = {"https": metrics_listen.rpartition(":")[0], "http": metrics_plain_listen.rpartition(":")[0]}
            print(f"scheduler ready on port {s.port}" + (f", join port {s.join_port}" if s.join_port else "")
                  + "\n" + metrics_lines(s.metrics_servers, "scheduler", hosts.__getitem__), end="", flush=True)

        async def stop() -> None:
            for s in holder:
                await s.stop()
            if live:
                await live.stop()

        await until_signalled(started, stop)

    tracing_opts.run_traced("persys-scheduler", otlp_endpoint, replica_id, lambda: run_main(main))


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
    workload_user: str = typer.Option("", "--workload-user",
                                      help="Who runs process workloads that name no user (the agent must be root). "
                                      "Empty: a user id of the workload's own from --process-uids (DynamicUser-like)."),
    process_uids: str = typer.Option("61184-65519", "--process-uids", metavar="FIRST-LAST",
                                     help="The user ids process workloads get one each of (systemd's DynamicUser "
                                     "range by default); ids the host's user or group tables know are skipped."),
    allow_node_path: list[Path] = typer.Option([], "--allow-node-path", help="A directory besides the state dir "
                                               "and /var/lib/persys whose files workloads may name (repeatable)."),
    metrics_listen: str = typer.Option("", "--metrics-listen", metavar="HOST:PORT", help=METRICS_LISTEN_HELP),
    metrics_plain_listen: str = typer.Option("", "--metrics-plain-listen", metavar="HOST:PORT",
                                             help=METRICS_PLAIN_HELP),
    storage: Path | None = typer.Option(None, "--storage", help="The node's volume drivers, a YAML file: "
                                        "`local: {pool: /var/lib/persys/volumes}`, `nfs: {server, export}`, "
                                        "`ceph-rbd: {monitors, pool, user, secretName}` (docs/storage.md). Each is "
                                        "probed at start; the node advertises what works and why the rest does not."),
    registry_auth: Path | None = typer.Option(
        None, "--registry-auth", metavar="FILE",
        help="Registry credentials for image pulls, JSON like Docker's config.json: {\"auths\": {\"HOST:PORT\": "
             "{\"auth\": \"<base64 user:password>\"}}} (or username+password, or identitytoken). Mode 0600 "
             "required; read at every pull, so an edit applies without a restart (and retries pulls it refused). "
             "Never logged. Containers pull as spec.container.pullPolicy says (IfNotPresent by default)."),
    otlp_endpoint: str | None = tracing_opts.OTLP_ENDPOINT,
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the node agent."""
    setup_logging(verbose)

    async def main() -> None:
        from persys.agent.agent import Agent, AgentConfig
        from persys.cli.servers.join_setup import agent_tls, certificate_hosts
        from persys.security.cluster_id import cluster_id_of_file

        check_node_id(node_id)
        uid_range = parse_process_uids(process_uids)
        storage_config = read_storage_config(storage)
        check_rgw_key(storage, storage_config)
        check_registry_auth(registry_auth)
        check_listen(metrics_listen, "--metrics-listen")
        check_listen(metrics_plain_listen, "--metrics-plain-listen")
        tls = await agent_tls(tls_dir, node_id, join_address, token, ca_pin,
                              certificate_hosts(listen, advertise_host))
        a = Agent(
            AgentConfig(node_id=node_id, scheduler=scheduler_addr, tls=tls, state_dir=state_dir,
                        labels=parse_labels(label), taints=parse_taints(taint),
                        cpu_millicores=cpu_millicores, memory_mb=memory_mb, listen=listen,
                        advertise_host=advertise_host, image_max_bytes=max_image_bytes, renew_certificate=renew,
                        metrics_listen=metrics_listen, metrics_plain_listen=metrics_plain_listen,
                        storage=storage_config, registry_auth=registry_auth, cluster_id=cluster_id_of_file(tls.ca)),
            default_runtimes(state_dir, node_id, workload_user, allow_node_path, registry_auth, uid_range,
                             cluster_id=cluster_id_of_file(tls.ca)),
        )

        async def started() -> None:
            await a.start()
            hosts = {"https": metrics_listen.rpartition(":")[0], "http": metrics_plain_listen.rpartition(":")[0]}
            print(f"agent {node_id} started (runtimes: {', '.join(sorted(a.runtimes)) or 'none'})\n"
                  + metrics_lines(a.metrics_servers, "agent", hosts.__getitem__), end="", flush=True)

        await until_signalled(started, a.stop)

    tracing_opts.run_traced("persys-agent", otlp_endpoint, node_id, lambda: run_main(main))


def _with_system_malloc() -> None:
    """Run the gateway on the C library's allocator (PYTHONMALLOC=malloc), re-executing once if
    needed. Python's own small-object arenas are freed only when wholly empty: a storm of 1,000
    connections left the RSS ~70 % above its baseline for good, where glibc hands the freed heap
    back (gateway.shedding trims it after a burst). PYTHONMALLOC set to anything, or
    PERSYS_GATEWAY_PYMALLOC=1, keeps the interpreter's choice."""
    if os.environ.get("PYTHONMALLOC") or os.environ.get("PERSYS_GATEWAY_PYMALLOC") == "1":
        return
    argv = list(getattr(sys, "orig_argv", []))
    # Only the `persys` program itself: a caller running the command in its own process (a
    # test's CliRunner, an embedding program) must never be replaced by a new interpreter.
    if not argv or Path(sys.argv[0]).name != "persys":
        return
    os.execve(sys.executable, [sys.executable, *argv[1:]], {**os.environ, "PYTHONMALLOC": "malloc"})


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
    max_in_flight: int = typer.Option(64, "--max-in-flight", min=1, max=100_000,
                                      help="API requests answered at once; more are refused at once with 503 and "
                                      "Retry-After (probes, metrics and streams are not counted)."),
    max_connections: int = typer.Option(1024, "--max-connections", min=1, max=100_000,
                                        help="TLS connections open or handshaking at once; more are refused at "
                                        "their first message with a TLS alert, before the handshake's costly part "
                                        "(a storm of new connections cannot starve the ones being answered)."),
    read_budget: float = typer.Option(0.0, "--read-budget", min=0, max=300, metavar="SECONDS",
                                      help="Answer API reads (GET) within this long (1.5 suits storms): their data, "
                                      "or 503 with Retry-After when the scheduler is overloaded (reads beyond "
                                      "--max-scheduler-calls and a queue of 8 are refused at once; a read past "
                                      "this long while the scheduler answers nothing is cut) instead of a 504 "
                                      "after the scheduler call's 10 s timeout. 0 (default): off."),
    max_scheduler_calls: int = typer.Option(2, "--max-scheduler-calls", min=1, max=10_000,
                                            help="API reads (GET) asking the scheduler at once; more wait for a "
                                            "slot (at most 1 s, and within the read budget) or are shed with 503 "
                                            "and Retry-After (the scheduler answers reads one at a time anyway)."),
    health_listen: str = typer.Option("", "--health-listen", metavar="HOST:PORT",
                                      help="Also answer GET /healthz in plain HTTP on this address, from a thread "
                                      "of its own: never behind API work or TLS handshakes (503 'stalled' if the "
                                      "event loop hangs 30 s). Bind it to a local or management address."),
    identity_from: str = idopt.IDENTITY_FROM, vault_addr: str = idopt.VAULT_ADDR,
    vault_ca_file: Path = idopt.VAULT_CA_FILE, vault_role_id_file: Path = idopt.VAULT_ROLE_ID_FILE,
    vault_secret_id_file: Path = idopt.VAULT_SECRET_ID_FILE, vault_pki_mount: str = idopt.VAULT_PKI_MOUNT,
    vault_approle_mount: str = idopt.VAULT_APPROLE_MOUNT, cert_ttl: int = idopt.CERT_TTL,
    cert_host: list[str] = idopt.CERT_HOST, runtime_dir: Path = idopt.RUNTIME_DIR,
    otlp_endpoint: str | None = tracing_opts.OTLP_ENDPOINT,
    grpc_listen: str = typer.Option("", "--grpc-listen", help="Also serve Persys Intelligence over gRPC "
                                    "(persys.v1.Intelligence: why, insights, rightsize, forecast) on host:port, "
                                    "mutual TLS with the gateway's certificate; off when empty."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the REST gateway (its certificate from --tls-dir, or from OpenBao/Vault with
    --identity-from openbao, renewed while it runs)."""
    _with_system_malloc()
    setup_logging(verbose)
    host, _, port_s = listen.rpartition(":")
    vault = idopt.VaultIdentityOptions(vault_addr, vault_ca_file, vault_role_id_file, vault_secret_id_file,
                                       vault_pki_mount, vault_approle_mount, cert_ttl, tuple(cert_host), runtime_dir)

    async def main() -> None:
        from persys.gateway.server import start_gateway

        idopt.check_source(identity_from, tls_dir)
        _check_gateway_listen(listen, health_listen)
        live = await idopt.start_identity(vault, "gateway") if identity_from == "openbao" else None
        tls = live.files if live else tls_from_dir(tls_dir, "gateway")
        holder = []

        async def started() -> None:
            limits = GatewayLimits(manifest_bytes=max_manifest_bytes, batch_bytes=max_batch_bytes,
                                   restore_bytes=max_restore_bytes, image_bytes=max_image_bytes,
                                   max_in_flight=max_in_flight, max_connections=max_connections,
                                   read_budget_s=read_budget, max_scheduler_calls=max_scheduler_calls)
            from persys.observability.metrics_http import parse_listen

            health = parse_listen(health_listen, "--health-listen") if health_listen else None  # checked above
            gw = await start_gateway(scheduler_addr, host, int(port_s), tls, limits, health, grpc_listen)
            holder.append(gw)
            if live:
                live.on_change(lambda _m: gw.reload_tls())
            if gw.grpc_server is not None:
                print(f"gateway gRPC (Persys Intelligence) on port {gw.grpc_port}", flush=True)
            also = f"; /healthz: http://{health[0]}:{gw.health.port}/healthz" if health and gw.health else ""
            print(f"gateway ready on https://{host}:{gw.port} (metrics: https://{host}:{gw.port}/metrics{also})",
                  flush=True)

        async def stop() -> None:
            for gw in holder:
                await gw.stop()
            if live:
                await live.stop()

        await until_signalled(started, stop)

    tracing_opts.run_traced("persys-gateway", otlp_endpoint, "", lambda: run_main(main))



def _check_gateway_listen(listen: str, health_listen: str) -> None:
    """--listen is host:port with the port free; --health-listen (if given) is well formed."""
    host, _, port_s = listen.rpartition(":")
    if not port_s.isdigit():
        raise ServerError(f"--listen {listen!r} must be host:port")
    if not port_free(host, int(port_s)):
        raise ServerError(f"port {port_s} on {host} is in use")
    if health_listen:
        check_listen(health_listen, "--health-listen")


def main() -> None:
    try:
        app()
    except ServerError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
