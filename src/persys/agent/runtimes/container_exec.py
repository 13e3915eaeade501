"""`persysctl exec` and `persysctl cp` in a container, through the Engine API (aiodocker).

Exec is `docker exec` without a TTY: the argv as given (no shell), stdin when given (then its
end, as `docker exec -i` half-closes the attached connection), stdout and stderr demultiplexed
and bounded (`exec_output`). The Engine API cannot kill an exec, so at the timeout
the agent kills its process (and what it started) by the host pid the engine reports: the agent
runs on the engine's host. Archives stream between the engine and a file on the node, capped,
never whole in memory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiodocker
from aiodocker.exceptions import DockerError

from persys.agent.runtimes.base import RuntimeFailure
from persys.agent.runtimes.exec_output import ExecOutput, OutputBuffer, kill_tree
from persys.agent.runtimes.terminal import NO_EXIT_CODE
from persys.model.limits import COPY_MAX_BYTES, human_bytes

_CHUNK = 1 << 20


def _failure(what: str, exc: DockerError, name: str) -> RuntimeFailure:
    if exc.status == 409:  # "container ... is not running" (or paused)
        return RuntimeFailure(f"{what}: {name} is not running", code="NotRunning")
    if exc.status == 404:
        return RuntimeFailure(f"{what}: {exc.message}", code="NotFound")
    return RuntimeFailure(f"{what}: {exc.message}")


async def exec_in(docker: aiodocker.Docker, container_id: str, name: str, command: Sequence[str],
                  kill_after: float, stdin: bytes = b"") -> ExecOutput:
    """Run `command` in the container (`stdin` its input), its output bounded; killed after
    `kill_after` seconds."""
    try:
        ex = await docker.containers.container(container_id).exec(list(command), stdout=True, stderr=True,
                                                                   stdin=bool(stdin), tty=False)
    except DockerError as exc:
        raise _failure("exec", exc, name) from exc
    out = OutputBuffer()

    async def feed(stream: Any) -> None:
        await stream.write_in(stdin)
        # The end of input: half-close the attached connection (aiodocker's close() would end the
        # reading side too, so its transport is reached directly).
        transport = stream._resp.connection.transport if stream._resp and stream._resp.connection else None
        if transport is not None and transport.can_write_eof():
            transport.write_eof()

    async def read(stream: Any) -> None:
        while (msg := await stream.read_out()) is not None:
            out.add(msg.stream, msg.data)

    async def pump() -> None:
        async with ex.start(detach=False) as stream:
            await asyncio.gather(*([feed(stream)] if stdin else []), read(stream))

    timed_out = False
    try:
        await asyncio.wait_for(pump(), kill_after)
    except TimeoutError:
        timed_out = True
        await _kill(ex)
    except DockerError as exc:
        raise _failure("exec", exc, name) from exc
    info = await _finished(ex)
    code = info.get("ExitCode")
    return out.result(137 if timed_out or code is None else int(code), timed_out=timed_out, target=name)


class ContainerTerminal:
    """`docker exec -it`: the command on a TTY in the container (one output stream: a TTY merges
    stdout and stderr). Closing it kills the command and what it started, as a timeout does."""

    def __init__(self, ex: Any, stream: Any, target: str) -> None:
        self.ex = ex
        self.stream = stream
        self.target = target

    async def read(self) -> bytes:
        msg = await self.stream.read_out()
        return b"" if msg is None else bytes(msg.data)

    async def write(self, data: bytes) -> None:
        await self.stream.write_in(data)

    async def resize(self, cols: int, rows: int) -> None:
        with contextlib.suppress(DockerError):  # the command may have just ended
            await self.ex.resize(h=rows, w=cols)

    async def close(self) -> int:
        with contextlib.suppress(DockerError):
            if (await self.ex.inspect()).get("Running"):
                await _kill(self.ex)
        await self.stream.close()
        with contextlib.suppress(RuntimeFailure):
            code = (await _finished(self.ex)).get("ExitCode")
            return NO_EXIT_CODE if code is None else int(code)
        return NO_EXIT_CODE


async def open_tty(docker: aiodocker.Docker, container_id: str, name: str, command: Sequence[str], cols: int,
                   rows: int) -> ContainerTerminal:
    """Start `command` on a TTY in the container, sized `cols` x `rows` when given."""
    try:
        ex = await docker.containers.container(container_id).exec(
            list(command), stdout=True, stderr=True, stdin=True, tty=True, environment=["TERM=xterm"])
        stream = ex.start(detach=False)
        await stream._init()  # started: only now can it be resized
    except DockerError as exc:
        raise _failure("exec", exc, name) from exc
    term = ContainerTerminal(ex, stream, name)
    if cols and rows:
        await term.resize(cols, rows)
    return term


async def _kill(ex: Any) -> None:
    with contextlib.suppress(DockerError):
        pid = int((await ex.inspect()).get("Pid") or 0)
        if pid > 0:
            await asyncio.to_thread(kill_tree, pid)


async def _finished(ex: Any, within: float = 5.0) -> dict[str, Any]:
    """The exec's inspect data once it stopped running (its exit code is set then)."""
    deadline = time.monotonic() + within
    while True:
        try:
            info: dict[str, Any] = await ex.inspect()
        except DockerError as exc:
            raise RuntimeFailure(f"exec: {exc.message}") from exc
        if not info.get("Running") or time.monotonic() >= deadline:
            return info
        await asyncio.sleep(0.05)


async def path_stat(docker: aiodocker.Docker, container_id: str, path: str) -> dict[str, Any] | None:
    """What the engine says of a path in the container (name, size, mode, ...), None if absent."""
    try:
        async with docker._query(f"containers/{container_id}/archive", method="GET",
                                 params={"path": path}) as resp:
            raw = resp.headers.get("X-Docker-Container-Path-Stat", "")
            resp.close()  # only the header was wanted, never the archive
    except DockerError as exc:
        if exc.status == 404:
            return None
        raise _failure("stat", exc, path) from exc
    stat: dict[str, Any] = json.loads(base64.b64decode(raw)) if raw else {}
    return stat


def is_dir(stat: dict[str, Any]) -> bool:
    return bool(int(stat.get("mode", 0)) & (1 << 31))  # Go's os.ModeDir


async def archive_to_file(docker: aiodocker.Docker, container_id: str, path: str, dest: Path,
                          cap: int = COPY_MAX_BYTES) -> int:
    """Write the engine's tar of `path` to `dest` (a file on the node), at most `cap` bytes."""
    size = 0
    try:
        async with docker._query(f"containers/{container_id}/archive", method="GET", params={"path": path},
                                 timeout=None) as resp:
            try:
                with dest.open("wb") as f:
                    async for chunk in resp.content.iter_chunked(_CHUNK):
                        size += len(chunk)
                        if size > cap:
                            raise RuntimeFailure(f"{path} is larger than the copy limit of {human_bytes(cap)}",
                                                 code="TooLarge")
                        await asyncio.to_thread(f.write, chunk)
            finally:
                resp.close()
    except DockerError as exc:
        if exc.status == 404:
            raise RuntimeFailure(f"copy: no {path} in the container", code="NotFound") from exc
        raise _failure("copy", exc, path) from exc
    return size


async def _file_chunks(src: Path) -> AsyncIterator[bytes]:
    with src.open("rb") as f:
        while chunk := await asyncio.to_thread(f.read, _CHUNK):
            yield chunk


async def unpack_file(docker: aiodocker.Docker, container_id: str, folder: str, src: Path) -> None:
    """Unpack the tar at `src` (a file on the node) into `folder` in the container."""
    try:
        async with docker._query(f"containers/{container_id}/archive", method="PUT", params={"path": folder},
                                 data=_file_chunks(src), headers={"Content-Type": "application/x-tar"},
                                 timeout=None) as resp:
            resp.close()
    except DockerError as exc:
        if exc.status == 404:
            raise RuntimeFailure(f"copy: no folder {folder} in the container", code="NotFound") from exc
        raise _failure("copy", exc, folder) from exc
