"""What the `persys` commands share: logging, ports, node labels and taints, TLS folders, the
agent's runtimes, the metrics listeners' options, and running until a signal."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from persys.cli.servers.errors import ServerError
from persys.model import Taint
from persys.model.node_names import node_id_problem
from persys.secrets.base import SecretStoreError
from persys.storage.config import StorageConfig, StorageConfigError, load_storage_config
from persys.tlsfiles import TLSFiles

if TYPE_CHECKING:
    from persys.agent.runtimes.base import Runtime
    from persys.observability.metrics_http import MetricsServer

METRICS_LISTEN_HELP = ("Serve Prometheus metrics at https://HOST:PORT/metrics: a client certificate from the cluster "
                       "CA is required, with the `get metrics` right (viewer and up; e.g. `persys certs issue --role "
                       "user --name prometheus --group persys:viewers`). Port 0 picks a free one (printed).")
METRICS_PLAIN_HELP = ("Also serve /metrics over plain HTTP at HOST:PORT, without authentication: only where you "
                      "want it, e.g. 127.0.0.1:9464 for a Prometheus on this host. Port 0 picks a free one.")


def metrics_lines(servers: Sequence[MetricsServer], who: str, host_of: Callable[[str], str]) -> str:
    """The ready lines of the metrics listeners (the bound ports, also for port 0)."""
    return "".join(f"{who} metrics on {m.scheme}://{host_of(m.scheme)}:{m.port}/metrics\n" for m in servers)


def check_listen(value: str, option: str) -> None:
    if not value:
        return
    from persys.observability.metrics_http import parse_listen

    try:
        parse_listen(value, option)
    except ValueError as e:
        raise ServerError(str(e)) from None


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    for noisy in ("aiodocker", "asyncio", "uvicorn.error", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def parse_labels(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ServerError(f"label {item!r} must look like key=value")
        out[k] = v
    return out


def parse_taints(items: list[str]) -> list[Taint]:
    taints = []
    for item in items:
        kv, _, effect = item.partition(":")
        k, _, v = kv.partition("=")
        if not k or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ServerError(f"taint {item!r} must look like key=value:NoSchedule|PreferNoSchedule|NoExecute")
        taints.append(Taint(key=k, value=v, effect=effect))  # type: ignore[arg-type]
    return taints



def read_storage_config(path: Path | None, allow_simulate: bool = False) -> StorageConfig | None:
    """`--storage FILE` read and checked (bounded); a ServerError naming the file and field."""
    if path is None:
        return None
    try:
        if path.stat().st_size > 64 * 1024:
            raise ServerError(f"--storage {path}: larger than 64 KiB")
        config = load_storage_config(path.read_text())
    except OSError as err:
        raise ServerError(f"--storage {path}: {err.strerror or err}") from None
    except StorageConfigError as err:
        raise ServerError(f"--storage {path}: {err}") from None
    if config.simulate and not allow_simulate:
        raise ServerError(f"--storage {path}: storage.simulate: only for persys dev's simulated nodes")
    return config


def check_rgw_key(path: Path | None, config: StorageConfig | None) -> None:
    """The scheduler's RGW admin key file readable and root-only, said at start in one line."""
    from persys.storage.base import StorageError
    from persys.storage.rgw_access import read_secret_key_file

    if path is not None and config is not None and config.rgw is not None:
        try:
            read_secret_key_file(config.rgw.secret_key_file)
        except StorageError as err:
            raise ServerError(f"--storage {path}: {err}") from None


def check_node_id(node_id: str) -> None:
    """Refuse at start what the scheduler would refuse at registration."""
    problem = node_id_problem(node_id)
    if problem:
        raise ServerError(f"--node-id: {problem}")


def tls_from_dir(directory: Path, name: str) -> TLSFiles:
    files = TLSFiles(directory / "ca.crt", directory / f"{name}.crt", directory / f"{name}.key")
    for f in (files.ca, files.cert, files.key):
        if not f.exists():
            raise ServerError(f"{f} is missing (create certificates with `persys certs init --dir {directory}`)")
    return files


def check_registry_auth(path: Path | None) -> None:
    """`--registry-auth FILE` usable at start (it is read again at every pull): one line naming
    the file and the fix, never anything it holds."""
    if path is None:
        return
    from persys.agent.runtimes.base import RuntimeFailure
    from persys.agent.runtimes.registry_auth import RegistryAuth

    try:
        RegistryAuth(path).for_image("localhost/check")
    except RuntimeFailure as err:
        raise ServerError(str(err.args[0])) from None


def parse_process_uids(text: str) -> tuple[int, int]:
    from persys.agent.runtimes.process_isolation import parse_uid_range

    try:
        return parse_uid_range(text)
    except ValueError as err:
        raise ServerError(f"--process-uids: {err}") from None


def default_runtimes(state_dir: Path, node_id: str, workload_user: str = "",
                     allow_node_paths: Sequence[Path] = (), registry_auth: Path | None = None,
                     uid_range: tuple[int, int] = (61184, 65519), cluster_id: str = "") -> list[Runtime]:
    from persys.agent.runtimes.compose import ComposeRuntime
    from persys.agent.runtimes.docker import DockerRuntime
    from persys.agent.runtimes.microvm.runtime import MicroVMRuntime
    from persys.agent.runtimes.node_paths import NodePaths
    from persys.agent.runtimes.process import ProcessRuntime
    from persys.agent.runtimes.secret_files import secrets_root
    from persys.agent.runtimes.vm import LibvirtVMRuntime
    from persys.agent.state_claim import StateDirTaken, claim_state_dir

    try:  # the state folder is one cluster's: another's agent given it is refused (#31)
        claim_state_dir(state_dir, cluster_id)
    except StateDirTaken as err:
        raise ServerError(str(err)) from None
    # Containers carry their node's name, so agents sharing one engine (tests, several
    # nodes on one host) never adopt or remove each other's containers.
    scope = {"persys.node": node_id}
    # Containers also carry the cluster's id: two clusters on one engine (two `persys dev`, the
    # test suite beside a cluster) never meet on a name nor take each other's (security.cluster_id).
    # Compose projects and VM domains carry it in their names too (compose.project_name, vm runtime).
    container_scope = {**scope, **({"persys.cluster": cluster_id} if cluster_id else {})}
    # Node paths workloads may name, re-checked here whatever the scheduler admitted.
    paths = NodePaths.for_agent(state_dir, allow_node_paths)
    secrets_at = state_dir / "runtimes" / "container-secrets", state_dir / "runtimes" / "container"
    return [
        DockerRuntime(extra_labels=container_scope, secrets_dir=secrets_root(*secrets_at, cluster_id),
                      legacy_secrets_dir=secrets_root(*secrets_at), registry_auth=registry_auth),
        ComposeRuntime(state_dir / "runtimes", extra_labels=scope, node_paths=paths, registry_auth=registry_auth,
                       cluster_id=cluster_id),
        LibvirtVMRuntime(state_dir / "runtimes", extra_labels=scope, node_paths=paths, cluster_id=cluster_id),
        MicroVMRuntime(state_dir / "runtimes", node_paths=paths),
        ProcessRuntime(state_dir / "runtimes", agent_id=node_id, workload_user=workload_user, uid_range=uid_range,
                       cluster_id=cluster_id),
    ]


async def until_signalled(started: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]) -> None:
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


def run_main(coro: Callable[[], Awaitable[None]]) -> None:
    from persys.observability.metrics_http import MetricsListenError

    try:
        asyncio.run(coro())  # type: ignore[arg-type]
    except (ServerError, SecretStoreError, MetricsListenError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
