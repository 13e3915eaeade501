"""Streaming a workload's output (`persysctl logs [-f] [--since] [--service]`), for every runtime.

Two kinds of source:

- Docker (containers, each compose service's containers): the engine records a time per line, so
  `since` and `timestamps` are exact; following ends when the container stops or is removed.
- Files (a process's stdout.log, a VM's serial console): written directly by the process or the
  hypervisor, which outlive the agent on purpose, so nothing stamps a time on each line as it is
  written. Where the runtime keeps a `log_times` index (when the agent saw the file grow), `since`
  and `timestamps` are answered from it (times at most a tick late, never early); without one
  they are refused with that reason. Following polls the file for growth and ends when the file
  goes away (the workload was removed).

Memory is bounded everywhere: a file is read in pieces of at most READ_CHUNK bytes, a partial
line is held up to that size, and the compose merge queue holds MERGE_QUEUE pieces. Each piece is
yielded to the caller before the next is read, so a slow reader (gRPC flow control) makes the
source be read more slowly instead of buffering more.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from aiodocker.exceptions import DockerError

from persys.agent.runtimes import log_times
from persys.agent.runtimes.base import ACCEPTED, LogQuery, RuntimeFailure, UnsupportedQuery

__all__ = ["ACCEPTED", "LogQuery", "UnsupportedQuery"]  # the contract's part, re-exported for the runtimes

READ_CHUNK = 64 * 1024  # bytes per file read, and the longest partial line held back
FOLLOW_POLL = 0.25  # seconds between looks at an idle file
MERGE_QUEUE = 64  # pieces the compose merge holds while the reader is slow
_TAIL_BYTES = 1 << 20  # a tail reads at most the last 1 MiB (as workdir.tail_text)


# ---- files ------------------------------------------------------------------------------------


def check_file_query(query: LogQuery, what: str, timed: bool = False) -> None:
    if (query.since or query.timestamps) and not timed:
        raise UnsupportedQuery(f"{what} carries no time per line, so --since and --timestamps cannot be answered "
                               "(the agent notes when its workloads' output appeared; this file has no notes); "
                               "use --tail")
    if query.service:
        raise UnsupportedQuery("--service selects a compose service; this workload is not a compose app")


def tail_with_end(path: Path, lines: int, max_bytes: int = _TAIL_BYTES) -> tuple[bytes, int]:
    """The last `lines` lines of a file and the offset its end had then (b"", 0 if it does not exist)."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(0, end - max_bytes))
            data = f.read(end - f.tell())
    except FileNotFoundError:
        return b"", 0
    return b"".join(data.splitlines(keepends=True)[-lines:] if lines > 0 else []), end


def line_start(path: Path, offset: int) -> int:
    """The start of the line holding byte `offset` (looking back at most READ_CHUNK bytes)."""
    with open(path, "rb") as f:
        f.seek(max(0, offset - READ_CHUNK))
        before = f.read(offset - f.tell())
    cut = before.rfind(b"\n")
    return offset - len(before) + cut + 1 if cut >= 0 else max(0, offset - len(before))


def read_from(path: Path, offset: int, limit: int = READ_CHUNK) -> tuple[bytes, int] | None:
    """Up to `limit` bytes after `offset` and the new offset; a file now shorter than `offset`
    was truncated or replaced and is read from its start. None: the file is gone."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < offset:
                offset = 0
            f.seek(offset)
            data = f.read(limit)
    except FileNotFoundError:
        return None
    return data, offset + len(data)


def split_lines(held: bytes, data: bytes, limit: int = READ_CHUNK) -> tuple[bytes, bytes]:
    """(complete lines to emit, the partial last line to hold). A partial line longer than
    `limit` is emitted as it is: memory stays bounded whatever the workload writes."""
    buf = held + data
    cut = buf.rfind(b"\n") + 1
    if cut == 0 and len(buf) >= limit:
        return buf, b""
    return buf[:cut], buf[cut:]


async def file_stream(path: Path, query: LogQuery, what: str, poll: float = FOLLOW_POLL,
                      timed: bool = False) -> AsyncIterator[str]:
    """A log file's tail (or all that came since `query.since`), then (following) what is
    appended, until the file goes away. `timed`: the runtime keeps the file's `log_times` index,
    so --since and --timestamps can be answered."""
    check_file_query(query, what, timed)
    yield ACCEPTED
    notes = await asyncio.to_thread(log_times.read_notes, path) if timed else []
    offset = 0
    async for piece, end in _history(path, query, notes):
        offset = end
        if piece:
            yield piece
    if not query.follow:
        return
    held = b""
    while True:
        got = await asyncio.to_thread(read_from, path, offset)
        if got is None:  # removed: the workload is gone
            if held:
                yield held.decode(errors="replace")
            return
        data, offset = got
        if data:
            lines, held = split_lines(held, data)
            if lines:
                yield _shown(query, lines, 0, [])  # seen now: within a poll of being written
            if len(data) == READ_CHUNK:
                continue  # more is waiting: no pause
        await asyncio.sleep(poll)


def _shown(query: LogQuery, lines: bytes, start: int, notes: list[log_times.Note]) -> str:
    """Whole lines from offset `start` as the query shows them (with their times, or not)."""
    if not query.timestamps:
        return lines.decode(errors="replace")
    return log_times.stamped(lines, start, notes, time.time())


async def _history(path: Path, query: LogQuery, notes: list[log_times.Note]) -> AsyncIterator[tuple[str, int]]:
    """The history a query asks for, as (piece, offset after it); the last offset is where
    following goes on (a partial last line is left to it, to be read whole)."""
    if query.since and query.tail <= 0:  # all that came since: read in pieces
        offset, held = await asyncio.to_thread(_since_offset, path, notes, query.since), b""
        while (got := await asyncio.to_thread(read_from, path, offset)) is not None and got[0]:
            data, offset = got
            lines, held = split_lines(held, data)
            yield (_shown(query, lines, offset - len(held) - len(lines), notes) if lines else ""), offset - len(held)
        if held and not query.follow:
            yield _shown(query, held, offset - len(held), notes), offset
        return
    data, offset = await asyncio.to_thread(tail_with_end, path, query.tail)
    start = offset - len(data)
    if query.since:  # --since and --tail: the last lines of those that came since
        since = await asyncio.to_thread(_since_offset, path, notes, query.since)
        while data and start < since:
            cut = data.find(b"\n") + 1 or len(data)
            data, start = data[cut:], start + cut
    yield (_shown(query, data, start, notes) if data else ""), offset


def _since_offset(path: Path, notes: list[log_times.Note], since: float) -> int:
    """Where the lines that may have come since `since` begin (0 for a file not there yet)."""
    try:
        return line_start(path, log_times.first_offset_since(notes, since))
    except FileNotFoundError:
        return 0


# ---- Docker -----------------------------------------------------------------------------------


def docker_params(query: LogQuery, *, stamped: bool) -> dict[str, Any]:
    """The engine's log parameters for a query (`stamped`: ask for times even if not shown)."""
    params: dict[str, Any] = {"tail": str(query.tail) if query.tail > 0 else "all" if query.since else "0",
                              "timestamps": stamped or query.timestamps}
    if query.since:
        params["since"] = f"{query.since:.9f}"  # seconds.nanoseconds, as the docker CLI sends it
    return params


async def _lines(chunks: AsyncIterator[str], prefix: str = "") -> AsyncIterator[str]:
    """Whole lines (each with `prefix`) from the engine's frames, which may split or join lines."""
    held = ""
    async for chunk in chunks:
        held += chunk
        *done, held = held.split("\n")
        if len(held) >= READ_CHUNK:
            done, held = [*done, held], ""
        for line in done:
            yield f"{prefix}{line}\n"
    if held:
        yield f"{prefix}{held}\n"


async def container_stream(docker: Any, container_id: str, query: LogQuery, prefix: str = "") -> AsyncIterator[str]:
    """One container's output (history per the query, then new lines while following)."""
    container = docker.containers.container(container_id)
    params = docker_params(query, stamped=False)
    try:
        if not query.follow:
            lines = await container.log(stdout=True, stderr=True, **params)
            text = "".join(lines)
            if text:
                yield "".join(f"{prefix}{line}\n" for line in text.splitlines()) if prefix else text
            return
        async for line in _lines(container.log(stdout=True, stderr=True, follow=True, **params), prefix):
            yield line
    except DockerError as exc:
        if exc.status == 404:  # removed while we read: the workload is gone
            return
        raise RuntimeFailure(f"logs: {exc.message}") from exc


def _strip_stamp(line: str) -> str:
    return line.split(" ", 1)[1] if " " in line else line


async def merged_history(docker: Any, sources: Sequence[tuple[str, str]], query: LogQuery) -> str:
    """Several containers' history (non-following) as one text in time order, the last `tail` lines
    overall: `sources` are (container id, line prefix)."""
    stamped: list[tuple[str, str]] = []
    for cid, prefix in sources:
        try:
            lines = await docker.containers.container(cid).log(stdout=True, stderr=True,
                                                               **docker_params(query, stamped=True))
        except DockerError as exc:
            if exc.status == 404:
                continue
            raise RuntimeFailure(f"logs: {exc.message}") from exc
        for line in "".join(lines).splitlines():
            stamp, _, rest = line.partition(" ")
            stamped.append((stamp, f"{prefix}{stamp + ' ' if query.timestamps else ''}{rest}\n"))
    stamped.sort(key=lambda s: s[0])  # RFC 3339 with fixed nanoseconds: text order is time order
    kept = stamped[-query.tail:] if query.tail > 0 else ([] if not query.since else stamped)
    return "".join(line for _, line in kept)


async def merge_streams(streams: Sequence[AsyncIterator[str]]) -> AsyncIterator[str]:
    """Pieces from several streams as they come, through a bounded queue (a slow reader pauses
    every source); ends when all have ended. The first failure of a source is raised."""
    queue: asyncio.Queue[str | BaseException | None] = asyncio.Queue(MERGE_QUEUE)  # None: a source ended

    async def pump(stream: AsyncIterator[str]) -> None:
        try:
            async for piece in stream:
                await queue.put(piece)
            await queue.put(None)
        except Exception as err:
            await queue.put(err)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                running -= 1
            else:
                yield item
    finally:  # the reader left or a source failed: stop every source now
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
