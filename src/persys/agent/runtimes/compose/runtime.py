"""Compose runtime: one Docker Compose application per workload, driven by the Compose v2 CLI.

Each workload is the Compose project `persys-<id>` (`project.py`). Its source (`source.py`: inline
YAML written here, a path read in place, or a git clone) lives under `<state_dir>/compose/<id>/`
next to an override file that puts persys labels on every service, network and volume, the env
file from `spec.env`, and `meta.json`. The Compose binary is found and run by `cli.py`.

Reading (list, inspect) goes through the Engine API by label (`observe.py` rolls the containers up
into one state), and stop/logs/down name only the project, so none of them needs the source to
still exist: a restarted agent adopts the project.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiodocker.exceptions import DockerError
from aiodocker.volumes import DockerVolume

from persys.agent.runtimes.base import (
    ObservedWorkload,
    Probe,
    RuntimeFailure,
    RuntimeState,
    RuntimeWorkload,
)
from persys.agent.runtimes.compose.admission import CONFIG_ARGS, judge, refusal
from persys.agent.runtimes.compose.cli import ComposeCLI, clip
from persys.agent.runtimes.compose.errors import config_error, quotes_only_itself
from persys.agent.runtimes.compose.observe import observe
from persys.agent.runtimes.compose.project import (
    COMPOSE_ONEOFF,
    COMPOSE_PROJECT,
    COMPOSE_SERVICE,
    COMPOSE_VOLUME,
    ENV_FILE,
    LABEL_RUNTIME,
    LABEL_WORKLOAD,
    OVERRIDE_FILE,
    PROJECT_PREFIX,
    ComposeMeta,
    choose_service,
    env_line,
    project_name,
)
from persys.agent.runtimes.compose.source import materialize
from persys.agent.runtimes.container_exec import ContainerTerminal, exec_in, open_tty
from persys.agent.runtimes.docker_client import LazyDocker, engine_unreachable, inspect_containers
from persys.agent.runtimes.docker_stats import sample_usage, total_usage
from persys.agent.runtimes.exec_output import ExecOutput
from persys.agent.runtimes.image_pull import PULL_TIMEOUT, ImagePuller
from persys.agent.runtimes.log_stream import (
    ACCEPTED,
    LogQuery,
    UnsupportedQuery,
    container_stream,
    merge_streams,
    merged_history,
)
from persys.agent.runtimes.node_paths import NodePaths
from persys.agent.runtimes.registry_auth import RegistryAuth
from persys.agent.runtimes.workdir import WorkDirs
from persys.model.workload import ComposeSpec, PullPolicy
from persys.policy import compose_env

log = logging.getLogger(__name__)

_ANON_VOLUME_RE = re.compile(r"^[0-9a-f]{64}$")  # the engine names anonymous volumes by a random id
_Services = list[str]  # (the class has a method named `list`)
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


class ComposeRuntime:
    """Runs `type: compose` workloads with Docker Compose v2 on the local Docker engine."""

    name = "compose"

    def __init__(
        self,
        state_dir: Path,
        *,
        url: str | None = None,
        compose_command: Sequence[str] | None = None,
        stop_timeout: int = 1,
        stats_timeout: float = 5.0,
        command_timeout: float = 300.0,
        extra_labels: dict[str, str] | None = None,
        node_paths: NodePaths | None = None,  # the agent's re-check of `path` and local git sources
        registry_auth: Path | None = None,
        pull_timeout: float = PULL_TIMEOUT,
        cluster_id: str = "",  # in new projects' names: two clusters on one engine never meet
    ) -> None:
        self._cluster_id = cluster_id
        self._dirs = WorkDirs(Path(state_dir) / "compose", ComposeMeta, lenient=True)
        self._node_paths = node_paths
        self._cli = ComposeCLI(url=url, compose_command=compose_command, command_timeout=command_timeout)
        self._stop_timeout = stop_timeout
        self._stats_timeout = stats_timeout
        # The runtime label keeps projects apart from DockerRuntime's containers; extra labels (the
        # node) keep agents that share one engine from adopting or removing each other's projects.
        self._scope = {LABEL_RUNTIME: self.name, **(extra_labels or {})}
        self._docker = LazyDocker(url)
        # Services' images come from registries as spec.compose.pullPolicy says, with the node's credentials.
        self._puller = ImagePuller(self._docker, RegistryAuth(registry_auth) if registry_auth else None,
                                   pull_timeout)
        # Per workload: start/stop/remove of one project are serialised, different projects overlap.
        self._locks: dict[str, asyncio.Lock] = {}

    async def close(self) -> None:
        await self._puller.close()
        await self._docker.close()

    def _lock(self, workload_id: str) -> asyncio.Lock:
        return self._locks.setdefault(workload_id, asyncio.Lock())

    def _dir(self, workload_id: str) -> Path:
        return self._dirs.path(workload_id)

    def _project(self, workload_id: str) -> str:
        """The instance's project: the one its meta records (a project keeps its name, and so its
        named volumes, for life; those from before cluster ids are `persys-<id>`), else a new
        name carrying the cluster id."""
        meta = self._read_meta(workload_id)
        return meta.project if meta is not None and meta.project else project_name(workload_id, self._cluster_id)

    def _read_meta(self, workload_id: str) -> ComposeMeta | None:
        return self._dirs.load(workload_id)

    def _write_meta(self, meta: ComposeMeta) -> None:
        self._dirs.save(meta)  # atomic: a crash never leaves a half-written meta.json

    # ---- probe ---------------------------------------------------------------------------------

    async def probe(self) -> Probe:
        try:
            _, version = await self._cli.resolve(verify=True)
        except Exception as exc:  # probe must never raise
            return Probe(available=False, reason=str(exc.args[0]) if exc.args else repr(exc))
        try:
            engine = await asyncio.wait_for(self._docker().version(), timeout=5)
        except Exception as exc:
            return Probe(available=False, reason=engine_unreachable(exc, self._docker.url))
        features = [f"engine:{engine.get('Version', '')}", f"api:{engine.get('ApiVersion', '')}",
                    "source:inline", "source:path", "retainVolumes"]
        if shutil.which("git"):
            features.append("source:git")
        return Probe(available=True, version=version, features=tuple(features))

    # ---- meta ----------------------------------------------------------------------------------

    # ---- reading -------------------------------------------------------------------------------

    def _filters(self, *extra: str) -> dict[str, list[str]]:
        return {"label": [*(f"{k}={v}" for k, v in self._scope.items()), *extra]}

    async def _containers(self, project: str | None = None) -> list[dict[str, Any]]:
        """Full inspect data of our containers (one project, or all), one-off `run` containers excluded."""
        extra = [f"{COMPOSE_PROJECT}={project}"] if project else [COMPOSE_PROJECT]
        details = await inspect_containers(self._docker(), self._filters(*extra))
        return [d for d in details
                if ((d.get("Config") or {}).get("Labels") or {}).get(COMPOSE_ONEOFF, "False") != "True"]

    async def _foreign(self, project: str) -> bool:
        """Whether containers of this project exist that are not ours (another node's or unmanaged)."""
        try:
            summaries = await self._docker().containers.list(
                all=True, filters=json.dumps({"label": [f"{COMPOSE_PROJECT}={project}"]})
            )
        except (DockerError, OSError) as exc:
            raise RuntimeFailure(f"list containers: {exc}") from exc
        for c in summaries:
            labels = c["Labels"] if "Labels" in c else {}
            if any(labels.get(k) != v for k, v in self._scope.items()):
                return True
        return False

    async def _add_stats(self, obs: ObservedWorkload, data: Sequence[dict[str, Any]]) -> None:
        running = [str(d["Id"]) for d in data if (d.get("State") or {}).get("Running")]
        samples = await asyncio.gather(*(sample_usage(self._docker(), cid, self._stats_timeout) for cid in running))
        obs.usage = total_usage(u for u in samples if u is not None)

    async def inspect(self, workload_id: str) -> ObservedWorkload | None:
        project = self._project(workload_id)
        data = await self._containers(project)
        if not data:
            return None
        obs = observe(workload_id, project, data, self._read_meta(workload_id))
        await self._add_stats(obs, data)
        return obs

    async def list(self) -> list[ObservedWorkload]:
        projects: dict[str, list[dict[str, Any]]] = {}
        for d in await self._containers():
            labels = (d.get("Config") or {}).get("Labels") or {}
            project = labels.get(COMPOSE_PROJECT, "")
            if project.startswith(PROJECT_PREFIX) and labels.get(LABEL_WORKLOAD):
                projects.setdefault(project, []).append(d)
        out = []
        for project, data in projects.items():
            wid = data[0]["Config"]["Labels"][LABEL_WORKLOAD]
            if self._project(wid) == project:
                out.append(observe(wid, project, data, self._read_meta(wid)))
        return out

    async def logs(self, workload_id: str, tail: int = 100) -> str:
        project = self._project(workload_id)
        if not await self._containers(project):
            return ""
        rc, out, err = await self._cli.compose(project, "logs", "--no-color", "--tail", str(tail), limit_s=60)
        if rc != 0:
            raise RuntimeFailure(f"logs {workload_id}: {clip(err)}")
        return out + err

    async def stream_logs(self, workload_id: str, query: LogQuery) -> AsyncIterator[str]:
        """The project's containers through the engine (times per line), like `docker compose logs`:
        each line prefixed by its service unless one service is asked for. Following covers the
        containers there when it starts."""
        data = await self._containers(self._project(workload_id))
        services = {str(d["Config"]["Labels"].get(COMPOSE_SERVICE, "")) for d in data}
        if query.service and query.service not in services:
            raise UnsupportedQuery(f"--service {query.service}: not a service of {workload_id} "
                                   f"(services: {', '.join(sorted(services)) or 'none running'})")
        yield ACCEPTED
        width = max((len(s) for s in services), default=0)
        sources = []  # (container id, line prefix)
        for d in sorted(data, key=lambda d: str(d.get("Name", ""))):
            svc = str(d["Config"]["Labels"].get(COMPOSE_SERVICE, ""))
            if not query.service or svc == query.service:
                sources.append((str(d["Id"]), "" if query.service else f"{svc:<{width}} | "))
        if not query.follow:
            text = await merged_history(self._docker(), sources, query)
            if text:
                yield text
            return
        async for piece in merge_streams([container_stream(self._docker(), cid, query, prefix)
                                          for cid, prefix in sources]):
            yield piece

    async def exec(self, workload_id: str, command: Sequence[str], *, service: str, kill_after: float,
                   stdin: bytes = b"") -> ExecOutput:
        """Run `command` in the container of `service` (the first, when it is scaled)."""
        cid, target = await self._service_container(workload_id, service)
        return await exec_in(self._docker(), cid, target, command, kill_after, stdin)

    async def open_terminal(self, workload_id: str, command: Sequence[str], *, service: str, cols: int,
                            rows: int) -> ContainerTerminal:
        """`command` on a TTY in the container of `service` (the first, when it is scaled)."""
        cid, target = await self._service_container(workload_id, service)
        return await open_tty(self._docker(), cid, target, command, cols, rows)

    async def _service_container(self, workload_id: str, service: str) -> tuple[str, str]:
        """(id, name) of the running container of `service` that exec and exec -t use."""
        project = self._project(workload_id)
        by_service: dict[str, list[dict[str, Any]]] = {}
        for d in await self._containers(project):
            svc = ((d.get("Config") or {}).get("Labels") or {}).get(COMPOSE_SERVICE, "")
            by_service.setdefault(svc, []).append(d)
        if not by_service:
            raise RuntimeFailure(f"{workload_id} has no containers on this node", code="NotFound")
        try:
            svc = choose_service(sorted(by_service), service)
        except ValueError as err:
            raise RuntimeFailure(f"{workload_id}: {err}", code="InvalidArgument") from err
        running = sorted((d for d in by_service[svc] if (d.get("State") or {}).get("Running")),
                         key=lambda d: str(d.get("Name", "")))
        if not running:
            raise RuntimeFailure(f"service {svc} of {workload_id} is not running", code="NotRunning")
        return str(running[0]["Id"]), str(running[0].get("Name", "")).lstrip("/")

    # ---- writing -------------------------------------------------------------------------------

    def _override(self, workload_id: str, model: dict[str, Any]) -> dict[str, Any]:
        labels = {**self._scope, LABEL_WORKLOAD: workload_id}
        out: dict[str, Any] = {"services": {s: {"labels": labels} for s in model.get("services") or {}}}
        # Networks and volumes too, so a delete can find exactly this node's resources; external ones
        # are not created by Compose and cannot carry labels.
        for kind in ("networks", "volumes"):
            own = {n: {"labels": labels} for n, c in (model.get(kind) or {}).items() if not (c or {}).get("external")}
            if own:
                out[kind] = own
        return out

    async def _images(self, workload_id: str, revision: str, model: dict[str, Any], spec: ComposeSpec,
                      credentials: Mapping[str, bytes]) -> None:
        """Every service's image on this node before `up` (which never pulls): pulled as
        spec.compose.pullPolicy says, in the background (persys.agent.runtimes.image_pull)."""
        wanted = sorted({
            str(conf["image"]) for conf in (model.get("services") or {}).values()
            if conf.get("image") and not conf.get("build")  # a service with build: makes its own
        })
        await self._puller.ensure(workload_id, wanted, spec.pull_policy or PullPolicy.IF_NOT_PRESENT, revision,
                                  credentials)

    async def start(self, w: RuntimeWorkload) -> ObservedWorkload:
        spec = w.spec.compose
        if w.spec.type != "compose" or spec is None:
            raise RuntimeFailure(f"workload type {w.spec.type!r} is not compose", code="InvalidSpec", terminal=True)
        bad_keys = [k for k in spec.env if not _ENV_KEY_RE.match(k)]
        if bad_keys:
            raise RuntimeFailure(f"invalid env variable name(s): {bad_keys}", code="InvalidSpec", terminal=True)
        # Plain and secret variables go to Compose's own environment: none may configure it.
        reserved = sorted(k for k in [*spec.env, *w.secrets.env] if compose_env.reserved(k))
        if reserved:
            raise RuntimeFailure(f"variable(s) {', '.join(reserved)}: refused by workload policy (composeEnv): "
                                 f"{compose_env.MESSAGE}", code="PolicyViolation", terminal=True)
        project = self._project(w.workload_id)
        wdir = self._dir(w.workload_id)
        async with self._lock(w.workload_id):
            meta = self._read_meta(w.workload_id)
            if meta is not None and meta.revision == w.revision and not meta.stopped:
                data = await self._containers(project)
                if data:
                    obs = observe(w.workload_id, project, data, meta)
                    if obs.state is RuntimeState.RUNNING:
                        return obs  # adopt: never touch a healthy project of the desired revision
            if await self._foreign(project):
                raise RuntimeFailure(f"compose project {project} exists but belongs to another owner")
            self._puller.still_pulling(w.workload_id, w.revision)  # no new clone and config meanwhile
            wdir.mkdir(parents=True, exist_ok=True)
            compose_file, commit = await materialize(self._cli, spec, wdir, self._node_paths)
            project_dir = compose_file.parent
            env_file = wdir / ENV_FILE
            env_file.write_text("".join(env_line(k, v) + "\n" for k, v in spec.env.items()))
            # The project's own .env first, spec.env last (later files win). The values also go in
            # the process environment, which Compose ranks above any env file, so they arrive verbatim.
            env_files = [f for f in (project_dir / ".env",) if f.is_file()] + [env_file]
            # Secret values (spec.secrets.env) go in the process environment only, never the env file.
            common: dict[str, Any] = {"project_dir": project_dir, "env_files": env_files,
                                      "env": {**spec.env, **w.secrets.env_text()}}

            model, services = await self._config(project, compose_file, spec, common)
            override = wdir / OVERRIDE_FILE
            # JSON (YAML 1.2 reads it the same): PyYAML writes YAML 1.1, which leaves `59118e51` or
            # `1e5` unquoted as strings, and Compose's YAML 1.2 reads those as floats: a workload or
            # label value of that shape came back as `5.9118e+55` and its containers were lost.
            override.write_text(json.dumps(self._override(w.workload_id, model), sort_keys=True))
            # Judged as it will run: `config` with exactly the files, variables and project of the up,
            # and the up runs that very output, given on its stdin: a file changed on the node after
            # the check (a path source a container can write to) changes nothing. Never written to
            # disk: it holds the values of secret variables.
            resolved = await self._admit(project, spec, [compose_file, override], common)
            await self._images(w.workload_id, w.revision, model, spec, w.secrets.registry_auth)

            # revision "" until up succeeds: a failed update must not look like the new revision
            # already running (the agent would treat it as exited instead of retrying the start).
            meta = ComposeMeta(w.workload_id, project, "", w.generation, services, list(spec.retain_volumes),
                               commit=commit)
            self._write_meta(meta)
            # up recreates only services whose configuration changed; -t bounds each replaced one's stop.
            rc, out, err = await self._cli.compose(
                project, "up", "-d", "--remove-orphans", "--pull", "never", "-t", str(self._stop_timeout),
                document=resolved, **common,
            )  # fmt: skip
            if rc != 0:
                raise self._up_failure(clip(err or out))
            meta.revision = w.revision
            self._write_meta(meta)
            data = await self._containers(project)
            if not data:
                raise RuntimeFailure(f"compose up of {project} left no containers")
            return observe(w.workload_id, project, data, meta)

    async def _config(self, project: str, compose_file: Path, spec: ComposeSpec,
                      common: dict[str, Any]) -> tuple[dict[str, Any], _Services]:
        """The project as Compose resolves it (`config --format json`) and the services to run,
        after the checks a resolved project allows."""
        rc, out, err = await self._cli.compose(
            project, "config", "--format", "json", files=[compose_file], limit_s=60, **common
        )
        if rc != 0:
            # Compose quotes the file: its output only for the client's own inline text, never
            # for a file on the node (a compose `path` may name any file).
            detail = (f"invalid compose file: {clip(err or out)}" if quotes_only_itself(spec.inline)
                      else config_error(err or out, compose_file.name))
            raise RuntimeFailure(detail, code="InvalidSpec", terminal=True)
        model: dict[str, Any] = json.loads(out)
        services = sorted(
            svc for svc, conf in (model.get("services") or {}).items()
            if conf.get("scale", 1) != 0 and (conf.get("deploy") or {}).get("replicas", 1) != 0
        )
        if not services:
            raise RuntimeFailure("the compose file defines no services to run", code="InvalidSpec", terminal=True)
        unknown = sorted(set(spec.retain_volumes) - set(model.get("volumes") or {}))
        if unknown:
            raise RuntimeFailure(
                f"retainVolumes names undeclared volume(s): {', '.join(unknown)}", code="InvalidSpec", terminal=True
            )
        return model, services

    async def _admit(self, project: str, spec: ComposeSpec, files: Sequence[Path], common: dict[str, Any]) -> str:
        """`docker compose config` of the project (JSON, which `up` takes as its compose file) once
        the workload policy admits it (admission.py); a terminal PolicyViolation naming each rule
        and field otherwise, nothing started."""
        rc, out, err = await self._cli.compose(project, *CONFIG_ARGS, files=files, limit_s=60, **common)
        if rc != 0:
            raise RuntimeFailure(config_error(err or out, files[0].name), code="InvalidSpec", terminal=True)
        found = judge(spec, json.loads(out), project, common["project_dir"])
        if found:
            raise refusal(found)
        return out

    @staticmethod
    def _up_failure(msg: str) -> RuntimeFailure:
        low = msg.lower()
        if "no such image" in low or "pull access denied" in low or "manifest unknown" in low:
            return RuntimeFailure(f"compose up: {msg}", code="ImageNotFound", terminal=True)
        if "port is already allocated" in low or "address already in use" in low:
            return RuntimeFailure(f"compose up: {msg}", code="PortConflict", terminal=True)
        return RuntimeFailure(f"compose up: {msg}")

    async def stop(self, workload_id: str) -> None:
        project = self._project(workload_id)
        async with self._lock(workload_id):
            meta = self._read_meta(workload_id)
            if meta is not None and not meta.stopped:
                meta.stopped = True  # before stopping, so nothing reads the exits as a crash
                self._write_meta(meta)
            if not await self._containers(project):
                return
            # The stopped containers stay, so their exit codes and logs remain inspectable.
            rc, _, err = await self._cli.compose(
                project, "stop", "-t", str(self._stop_timeout), limit_s=self._stop_timeout + 60
            )
            if rc != 0:
                raise RuntimeFailure(f"compose stop {project}: {clip(err)}")

    async def remove(self, workload_id: str) -> None:
        self._puller.forget(workload_id)
        project = self._project(workload_id)
        async with self._lock(workload_id):
            if await self._foreign(project):
                log.warning("not removing compose project %s: it belongs to another owner", project)
            else:
                meta = self._read_meta(workload_id)
                await self._down(project, None if meta is None else set(meta.retain_volumes))
            self._dirs.remove(workload_id)

    async def _down(self, project: str, retain: set[str] | None) -> None:
        """Remove the project's containers, networks and volumes, except retained named volumes.

        `retain=None` means unknown (meta.json is lost): named volumes are kept then, because data
        once deleted cannot come back and they may have been retained.
        """
        # A recreated container inherits its predecessor's anonymous volumes by name, after which
        # neither `down -v` nor `rm -v` counts them as anonymous: collect them while they are mounted.
        anonymous = {
            str(m["Name"]) for d in await self._containers(project) for m in d.get("Mounts") or []
            if m.get("Type") == "volume" and _ANON_VOLUME_RE.match(str(m.get("Name", "")))
        }
        t = str(self._stop_timeout)
        args = ("down", "-v", "--remove-orphans", "-t", t) if retain == set() else ("down", "--remove-orphans", "-t", t)
        rc, _, err = await self._cli.compose(project, *args, limit_s=self._stop_timeout + 120)
        if rc != 0:
            raise RuntimeFailure(f"compose down {project}: {clip(err)}")
        try:
            vols = await self._docker().volumes.list(
                filters={"label": [f"{COMPOSE_PROJECT}={project}", *(f"{k}={v}" for k, v in self._scope.items())]}
            )
        except (DockerError, OSError) as exc:
            raise RuntimeFailure(f"list volumes of {project}: {exc}") from exc
        named = {str(v["Name"]): (v.get("Labels") or {}).get(COMPOSE_VOLUME) for v in vols.get("Volumes") or []}
        doomed = anonymous - set(named)
        if retain:
            doomed |= {name for name, key in named.items() if key not in retain}
        for name in sorted(doomed):
            try:
                await DockerVolume(self._docker(), name).delete()
            except DockerError as exc:
                if exc.status == 409:  # still mounted by a container outside the project: not ours to break
                    log.warning("volume %s of %s is in use elsewhere, left in place", name, project)
                elif exc.status != 404:  # already gone is what we wanted
                    raise RuntimeFailure(f"remove volume {name}: {exc.message}") from exc
            except OSError as exc:
                raise RuntimeFailure(f"docker engine not reachable: {exc}") from exc
