"""Docker runtime: one container per workload, driven through the Engine API (aiodocker).

Containers are found again by name (`persys-<id>`) and labels, never by in-memory state, so a
restarted agent adopts what is already running instead of starting a second copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import tarfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from aiodocker.exceptions import DockerError

from persys.agent.runtimes.base import (
    ObservedWorkload,
    Probe,
    RuntimeFailure,
    RuntimeState,
    RuntimeWorkload,
)
from persys.agent.runtimes.container_exec import (
    ContainerTerminal,
    archive_to_file,
    exec_in,
    is_dir,
    open_tty,
    path_stat,
    unpack_file,
)
from persys.agent.runtimes.docker_client import LazyDocker, engine_unreachable, inspect_containers
from persys.agent.runtimes.docker_stats import parse_docker_time, sample_usage
from persys.agent.runtimes.exec_output import ExecOutput
from persys.agent.runtimes.image_pull import PULL_TIMEOUT, ImagePuller
from persys.agent.runtimes.log_stream import ACCEPTED, LogQuery, UnsupportedQuery, container_stream
from persys.agent.runtimes.registry_auth import RegistryAuth
from persys.agent.runtimes.secret_files import remove_secret_files, write_secret_files
from persys.model.copy_archive import CopyError, landing, rewrite, top_entry
from persys.model.workload import ContainerSpec

SECRETS_TARGET = "/run/secrets"  # where a container finds its spec.secrets.files

LABEL_WORKLOAD = "persys.workload"
LABEL_REVISION = "persys.revision"
LABEL_GENERATION = "persys.generation"
LABEL_MANAGED = "persys.managed"
NAME_PREFIX = "persys-"
MIN_MEMORY_MB = 6  # the engine refuses smaller limits; reject early with a clear reason


LABEL_NODE = "persys.node"
LABEL_CLUSTER = "persys.cluster"  # the cluster's id (security.cluster_id): two clusters share an engine


def container_name(workload_id: str, node_id: str = "", cluster_id: str = "") -> str:
    """`persys-<cluster>-<node>-<instance>`: names are host-wide, so two clusters or two agents
    sharing one engine (several nodes on one host, tests) never meet on a name. The names
    containers had before (`persys-<node>-<instance>`, `persys-<instance>`) are still found and
    adopted by `_show`."""
    scope = "".join(f"{part}-" for part in (cluster_id, node_id) if part)
    return f"{NAME_PREFIX}{scope}{workload_id}"



def with_volumes_and_devices(host: dict[str, Any], w: RuntimeWorkload) -> dict[str, Any]:
    """`host` with the workload's attached volumes bound in and the GPUs its placement gave it."""
    volume_binds = [{"Type": "bind", "Source": m.attachment.mount_path, "Target": m.mount_path,
                     "ReadOnly": m.read_only} for m in w.mounts if m.attachment.mount_path]
    if volume_binds:
        host["Mounts"] = [*host.get("Mounts", []), *volume_binds]
    if w.devices:  # as `docker run --gpus device=...` asks
        host["DeviceRequests"] = to_docker_requests(w.devices)
    return host


def to_docker_requests(device_ids: tuple[str, ...]) -> list[dict[str, object]]:
    """Docker's HostConfig.DeviceRequests for the GPUs an instance was given, what `docker run
    --gpus device=<id>,...` sends: the NVIDIA container runtime hands exactly those to it."""
    return [{"Driver": "nvidia", "DeviceIDs": list(device_ids), "Capabilities": [["gpu"]], "Count": 0}]

class DockerRuntime:
    """Runs `type: container` workloads on the local Docker engine."""

    name = "container"

    def __init__(
        self,
        url: str | None = None,
        *,
        stop_timeout: int = 3,
        stats_timeout: float = 5.0,
        extra_labels: dict[str, str] | None = None,
        secrets_dir: Path | None = None,
        legacy_secrets_dir: Path | None = None,  # where agents before cluster ids wrote them
        registry_auth: Path | None = None,
        pull_timeout: float = PULL_TIMEOUT,
    ) -> None:
        # Where containers' secret files are written (bind-mounted read-only at /run/secrets).
        self._secrets_dir = secrets_dir
        # A container started before cluster ids keeps its files there until it is removed.
        self._legacy_secrets_dir = legacy_secrets_dir if legacy_secrets_dir != secrets_dir else None
        self._stop_timeout = stop_timeout
        self._stats_timeout = stats_timeout
        self._extra_labels = dict(extra_labels or {})
        self._docker = LazyDocker(url)
        # Images come from registries as spec.container.pullPolicy says, with the node's credentials.
        self._puller = ImagePuller(self._docker, RegistryAuth(registry_auth) if registry_auth else None,
                                   pull_timeout)
        self._lock = asyncio.Lock()  # serialises start/stop/remove so adoption checks are not racy

    async def close(self) -> None:
        await self._puller.close()
        await self._docker.close()

    async def probe(self) -> Probe:
        try:
            version = await asyncio.wait_for(self._docker().version(), timeout=5)
            info = await asyncio.wait_for(self._docker().system.info(), timeout=5)
        except Exception as exc:  # any failure means "not usable", probe must never raise
            return Probe(available=False, reason=engine_unreachable(exc, self._docker.url))
        features = ["init", f"api:{version.get('ApiVersion', '')}"]
        if info.get("CgroupVersion"):
            features.append(f"cgroups:v{info['CgroupVersion']}")
        return Probe(available=True, version=str(version.get("Version", "")), features=tuple(features))

    # ---- reading -------------------------------------------------------------------------------

    @property
    def _node(self) -> str:
        return self._extra_labels.get(LABEL_NODE, "")

    @property
    def _cluster(self) -> str:
        return self._extra_labels.get(LABEL_CLUSTER, "")

    def _ours(self, labels: dict[str, str], legacy: bool) -> bool:
        """Managed by Persys with this agent's scope; under a name of before cluster ids (`legacy`),
        one that carries no cluster label at all (another cluster's new containers never match)."""
        if labels.get(LABEL_MANAGED) != "true":
            return False
        scope = dict(self._extra_labels)
        if legacy and self._cluster:
            if LABEL_CLUSTER in labels:
                return False
            scope.pop(LABEL_CLUSTER)
        return all(labels.get(k) == v for k, v in scope.items())

    async def _show(self, workload_id: str) -> dict[str, Any] | None:
        """Our container of this instance: by its name, or by a name it had before names carried
        the cluster and the node (adopted after an agent upgrade). One whose labels say it is not
        ours (another cluster's or node's, or not Persys') is never managed or adopted."""
        names = [container_name(workload_id, self._node, self._cluster)]
        names += [n for n in (container_name(workload_id, self._node), container_name(workload_id))
                  if n not in names]
        for i, name in enumerate(names):
            try:
                data: dict[str, Any] = await self._docker()._query_json(f"containers/{name}/json", method="GET")
            except DockerError as exc:
                if exc.status == 404:
                    continue
                raise RuntimeFailure(f"inspect {workload_id}: {exc.message}") from exc
            except OSError as exc:
                raise RuntimeFailure(f"docker engine not reachable: {exc}") from exc
            labels = (data.get("Config") or {}).get("Labels") or {}
            if self._ours(labels, legacy=i > 0):
                return data
        return None

    @staticmethod
    def _observe(data: dict[str, Any]) -> ObservedWorkload:
        labels = (data.get("Config") or {}).get("Labels") or {}
        st = data.get("State") or {}
        status = st.get("Status", "")
        exit_code: int | None = None
        message = st.get("Error") or ""
        if status in ("running", "restarting", "paused"):
            state = RuntimeState.RUNNING
            if status != "running":
                message = message or status
        elif status == "created":
            state = RuntimeState.STOPPED
            message = message or "created, not started"
        else:  # exited, dead, removing
            exit_code = int(st.get("ExitCode", 0))
            oom = bool(st.get("OOMKilled"))
            # 143/137 = SIGTERM/SIGKILL through tini: what `stop` (ours or an operator's) produces.
            # The engine does not expose who stopped it, so treat these as stopped, not failed.
            stopped = exit_code in (0, 143, 137) and not oom
            state = RuntimeState.STOPPED if stopped else RuntimeState.FAILED
            if not message:
                message = "OOMKilled" if oom else f"exited with code {exit_code}"
        try:
            generation = int(labels.get(LABEL_GENERATION, "0"))
        except ValueError:
            generation = 0
        return ObservedWorkload(
            workload_id=labels.get(LABEL_WORKLOAD, ""),
            revision=labels.get(LABEL_REVISION, ""),
            generation=generation,
            state=state,
            runtime_id=str(data.get("Id", "")),
            message=message,
            exit_code=exit_code,
            started_at=parse_docker_time(st.get("StartedAt")),
        )

    async def _add_stats(self, obs: ObservedWorkload) -> None:
        usage = await sample_usage(self._docker(), obs.runtime_id, self._stats_timeout)
        if usage is not None:
            obs.usage = usage

    async def inspect(self, workload_id: str) -> ObservedWorkload | None:
        data = await self._show(workload_id)
        if data is None:
            return None
        obs = self._observe(data)
        if obs.state is RuntimeState.RUNNING:
            await self._add_stats(obs)
        return obs

    async def list(self) -> list[ObservedWorkload]:
        # Not filtered on the cluster label: containers from before cluster ids have none (and are
        # still ours); `_ours` drops another cluster's.
        scope = [f"{k}={v}" for k, v in self._extra_labels.items() if k != LABEL_CLUSTER]
        found = await inspect_containers(self._docker(), {"label": [f"{LABEL_MANAGED}=true", *scope]})
        labelled = [(d, (d.get("Config") or {}).get("Labels") or {}) for d in found]
        mine = [d for d, labels in labelled if self._ours(labels, legacy=LABEL_CLUSTER not in labels)]
        return [obs for obs in map(self._observe, mine) if obs.workload_id]

    async def logs(self, workload_id: str, tail: int = 100) -> str:
        data = await self._show(workload_id)
        if data is None:
            return ""
        try:
            lines = await self._docker().containers.container(data["Id"]).log(stdout=True, stderr=True, tail=tail)
        except DockerError as exc:
            raise RuntimeFailure(f"logs {workload_id}: {exc.message}") from exc
        return "".join(lines)

    async def stream_logs(self, workload_id: str, query: LogQuery) -> AsyncIterator[str]:
        if query.service:
            raise UnsupportedQuery("--service selects a compose service; this workload is a single container")
        yield ACCEPTED
        data = await self._show(workload_id)
        if data is None:
            return
        async for piece in container_stream(self._docker(), data["Id"], query):
            yield piece

    # ---- writing -------------------------------------------------------------------------------

    def _config(self, w: RuntimeWorkload, c: ContainerSpec) -> dict[str, Any]:
        res = w.spec.resources
        if res.memory_mb and res.memory_mb < MIN_MEMORY_MB:
            raise RuntimeFailure(
                f"memory_mb={res.memory_mb} is below Docker's minimum of {MIN_MEMORY_MB}",
                code="InvalidSpec",
                terminal=True,
            )
        labels = {
            **self._extra_labels,
            LABEL_WORKLOAD: w.workload_id,
            LABEL_REVISION: w.revision,
            LABEL_GENERATION: str(w.generation),
            LABEL_MANAGED: "true",
        }
        config: dict[str, Any] = {
            "Image": c.image,
            "Env": [f"{k}={v}" for k, v in {**c.env, **w.secrets.env_text()}.items()],
            "Labels": labels,
        }
        if c.command:
            # `command` replaces the image's whole entrypoint+cmd; an empty Entrypoint clears it.
            config["Entrypoint"] = []
            config["Cmd"] = [*c.command, *c.args]
        elif c.args:
            config["Cmd"] = list(c.args)  # keep the image entrypoint, replace only its arguments
        if c.working_dir:
            config["WorkingDir"] = c.working_dir
        exposed, bindings = port_maps(c)
        if exposed:
            config["ExposedPorts"] = exposed
        host: dict[str, Any] = {
            "Init": True,  # tini as PID 1: signals reach the command and zombies get reaped
            "RestartPolicy": {"Name": "no"},  # the agent owns restarts and their backoff
            "PortBindings": bindings,
        }
        if res.cpu_millicores:
            host["NanoCpus"] = res.cpu_millicores * 1_000_000
        if res.memory_mb:
            host["Memory"] = res.memory_mb * 1024 * 1024
            host["MemorySwap"] = res.memory_mb * 1024 * 1024  # no swap beyond the limit
        if w.spec.secrets is not None and w.spec.secrets.files:
            if self._secrets_dir is None:
                raise RuntimeFailure("this agent keeps no secret files for containers", code="InvalidSpec",
                                     terminal=True)
            src = self._secrets_dir / w.workload_id  # written once the start is decided (_create_and_start)
            host["Mounts"] = [{"Type": "bind", "Source": str(src), "Target": SECRETS_TARGET, "ReadOnly": True}]
        config["HostConfig"] = with_volumes_and_devices(host, w)
        return config

    async def start(self, w: RuntimeWorkload) -> ObservedWorkload:
        c = w.spec.container
        if w.spec.type != "container" or c is None:
            raise RuntimeFailure(f"workload type {w.spec.type!r} is not a container", code="InvalidSpec", terminal=True)
        config = self._config(w, c)
        async with self._lock:
            existing = await self._show(w.workload_id)
            if existing is not None:
                obs = self._observe(existing)
                if obs.revision == w.revision and obs.state is RuntimeState.RUNNING:
                    return obs  # adopt: never restart a healthy container of the desired revision
            # Before the old container goes: it keeps running while the new image comes down.
            await self._puller.ensure(w.workload_id, [c.image], w.spec.pull_policy(),
                                      credentials=w.secrets.registry_auth)
            if existing is not None:
                await self._delete(existing["Id"])
            return await self._create_and_start(w, config)

    async def _create_and_start(self, w: RuntimeWorkload, config: dict[str, Any]) -> ObservedWorkload:
        docker = self._docker()
        if self._secrets_dir is not None and w.spec.secrets is not None and w.spec.secrets.files:
            write_secret_files(self._secrets_dir / w.workload_id, w.secrets.files)
        try:
            container = await docker.containers.create(config, name=container_name(w.workload_id, self._node,
                                                                                   self._cluster))
        except DockerError as exc:
            if exc.status == 409:
                # Someone else (another agent instance) created it meanwhile: adopt theirs.
                data = await self._show(w.workload_id)
                if data is not None:
                    return self._observe(data)
            code, terminal = ("InvalidSpec", True) if exc.status == 400 else ("RuntimeError", False)
            if exc.status == 404:
                code, terminal = "ImageNotFound", True
            raise RuntimeFailure(f"create container: {exc.message}", code=code, terminal=terminal) from exc
        try:
            await container.start()
        except DockerError as exc:
            # A container that never started is useless; remove it so a retry starts clean.
            await self._delete(container.id)
            msg = exc.message
            if "port is already allocated" in msg or "address already in use" in msg:
                raise RuntimeFailure(f"start container: {msg}", code="PortConflict", terminal=True) from exc
            if "executable file not found" in msg or "no such file or directory" in msg:
                raise RuntimeFailure(f"start container: {msg}", code="InvalidSpec", terminal=True) from exc
            if "could not select device driver" in msg:  # Docker has no NVIDIA runtime for the GPUs given
                raise RuntimeFailure(f"start container: {msg} (the node's GPUs need the NVIDIA container toolkit)",
                                     code="DeviceUnavailable") from exc
            raise RuntimeFailure(f"start container: {msg}") from exc
        data = await container.show()
        return self._observe(data)

    async def _delete(self, container_id: str) -> None:
        try:
            container = self._docker().containers.container(container_id)
            # Stop first with a short grace so the command sees SIGTERM; force-delete kills the rest.
            try:
                await container.stop(t=self._stop_timeout)
            except DockerError as exc:
                if exc.status not in (304, 404):
                    raise
            await container.delete(force=True, v=True)
        except DockerError as exc:
            # 404: already gone; 409: removal already in progress. Both mean "will be gone".
            if exc.status not in (404, 409):
                raise RuntimeFailure(f"remove container: {exc.message}") from exc

    async def stop(self, workload_id: str) -> None:
        async with self._lock:
            data = await self._show(workload_id)
            if data is None or not (data.get("State") or {}).get("Running"):
                return
            try:
                # The stopped container stays, so its exit code and logs remain inspectable.
                await self._docker().containers.container(data["Id"]).stop(t=self._stop_timeout)
            except DockerError as exc:
                if exc.status not in (304, 404):
                    raise RuntimeFailure(f"stop container: {exc.message}") from exc

    async def remove(self, workload_id: str) -> None:
        self._puller.forget(workload_id)
        async with self._lock:
            data = await self._show(workload_id)
            if data is not None:
                await self._delete(data["Id"])
            for root in (self._secrets_dir, self._legacy_secrets_dir):
                if root is not None:
                    remove_secret_files(root / workload_id)

    # ---- exec and copy (persysctl exec, cp) ----------------------------------------------------

    async def _existing(self, workload_id: str, *, running: bool) -> tuple[str, str]:
        """The id and name of the instance's container (running, if asked)."""
        data = await self._show(workload_id)
        if data is None:
            raise RuntimeFailure(f"{workload_id} has no container on this node", code="NotFound")
        if running and not (data.get("State") or {}).get("Running"):
            raise RuntimeFailure(f"{workload_id} is not running ({self._observe(data).message or 'stopped'})",
                                 code="NotRunning")
        return str(data["Id"]), str(data.get("Name", "")).lstrip("/")

    async def exec(self, workload_id: str, command: Sequence[str], *, service: str, kill_after: float,
                   stdin: bytes = b"") -> ExecOutput:
        if service:
            raise RuntimeFailure("--service names a compose service; this is a container", code="InvalidArgument")
        cid, name = await self._existing(workload_id, running=True)
        return await exec_in(self._docker(), cid, name, command, kill_after, stdin)

    async def open_terminal(self, workload_id: str, command: Sequence[str], *, service: str, cols: int,
                            rows: int) -> ContainerTerminal:
        if service:
            raise RuntimeFailure("--service names a compose service; this is a container", code="InvalidArgument")
        cid, name = await self._existing(workload_id, running=True)
        return await open_tty(self._docker(), cid, name, command, cols, rows)

    async def copy_from(self, workload_id: str, path: str, dest: Path) -> int:
        cid, _ = await self._existing(workload_id, running=False)
        return await archive_to_file(self._docker(), cid, path, dest)

    async def copy_to(self, workload_id: str, path: str, archive: Path) -> str:
        """Unpack `archive` (one entry at its top) at `path`: into it when it is a folder in the
        container, else as it (the top entry renamed, in its parent folder)."""
        cid, _ = await self._existing(workload_id, running=False)
        try:
            top = await asyncio.to_thread(_top_of, archive)
            stat = await path_stat(self._docker(), cid, path)
            folder, name = landing(path, stat is not None and is_dir(stat), top)
        except CopyError as err:
            raise RuntimeFailure(str(err), code="InvalidArgument") from err
        if name == top:
            await unpack_file(self._docker(), cid, folder, archive)
        else:
            moved = archive.with_name(archive.name + ".renamed")
            try:
                await asyncio.to_thread(_rewrite_file, archive, moved, top, name)
                await unpack_file(self._docker(), cid, folder, moved)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    moved.unlink()
        return f"{folder.rstrip('/')}/{name}"


def _top_of(archive: Path) -> str:
    try:
        with tarfile.open(archive, mode="r:") as tar:
            return top_entry(tar.getnames())
    except tarfile.TarError as err:
        raise CopyError(f"not a tar archive: {err}") from err


def _rewrite_file(src: Path, dst: Path, top: str, new_top: str) -> None:
    with src.open("rb") as fin, dst.open("wb") as fout:
        rewrite(fin, fout, top, new_top)


def port_maps(c: ContainerSpec) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, str]]]]:
    """Docker's ExposedPorts and PortBindings for the container's ports (`8080/tcp` keys)."""
    exposed: dict[str, dict[str, Any]] = {}
    bindings: dict[str, list[dict[str, str]]] = {}
    for p in c.ports:
        key = f"{p.container_port}/{p.protocol}"
        exposed[key] = {}
        bindings.setdefault(key, []).append({"HostIp": p.host_ip, "HostPort": str(p.host_port) if p.host_port else ""})
    return exposed, bindings
