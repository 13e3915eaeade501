"""When the output of a log file appeared: `persysctl logs --since` and `--timestamps` for the
runtimes whose output goes straight to a file (a process's stdout.log, a VM's serial console).

The process (or the hypervisor) writes the file itself and outlives the agent on purpose, so
nothing stamps a time on each line as it is written. Instead the agent notes, every
`TICK_SECONDS` while it runs, how long each such file has grown: a line `<offset> <unix time>`
in `<log>.times` whenever the size changed ("by this time, the file held this many bytes"). A
line's time is then the first note that covers it: when the agent first saw it, at most one tick
after it was written while the agent runs, and when the agent came back for what was written
while it was down. Times are never early, so `--since` never leaves out a line written after
the time asked (it may include a few written up to a tick before it). Following stamps each
piece as it is read (every 0.25 s).

The index is bounded: past `MAX_NOTES` notes every other one is dropped (older output's times
get coarser, never earlier). A file that shrank (replaced, truncated) starts a new index.
The decisions are pure functions over the notes; `LogClock` is the I/O.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import datetime as dt
import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0
MAX_NOTES = 20_000  # per log: a day of output changing every 4 s, ~400 KB
SUFFIX = ".times"

Note = tuple[int, float]  # (bytes the file held, unix time it was seen so)


def times_path(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def parse(text: str) -> list[Note]:
    """The notes of an index file (lines that do not read as a note are skipped). Pure."""
    notes: list[Note] = []
    for line in text.splitlines():
        offset, _, seen = line.partition(" ")
        try:
            note = (int(offset), float(seen))
        except ValueError:
            continue
        if not notes or note[0] > notes[-1][0]:
            notes.append(note)
    return notes


def first_offset_since(notes: list[Note], since: float) -> int:
    """Where output that may have been written at or after `since` begins: the size the file had
    at the last note before `since` (0 with none). Pure."""
    i = bisect.bisect_left([seen for _, seen in notes], since)
    return notes[i - 1][0] if i > 0 else 0


def seen_at(notes: list[Note], offset: int, now: float) -> float:
    """When the byte at `offset` was first seen: the first note past it (`now` if none is). Pure."""
    i = bisect.bisect_right([size for size, _ in notes], offset)
    return notes[i][1] if i < len(notes) else now


def thinned(notes: list[Note]) -> list[Note]:
    """Every other note, the last kept: times get coarser, never earlier. Pure."""
    return [*notes[-2::-2][::-1], notes[-1]] if len(notes) > 1 else notes


def rfc3339(ts: float) -> str:
    """As the container runtime stamps lines: UTC, nanoseconds."""
    whole = math.floor(ts)
    carry, ns = divmod(round((ts - whole) * 1e9), 1_000_000_000)  # ts * 1e9 would lose digits
    whole += carry
    return dt.datetime.fromtimestamp(whole, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{ns:09d}Z"


def stamped(lines: bytes, start: int, notes: list[Note], now: float) -> str:
    """`lines` (the file's bytes from offset `start`, whole lines) with each line's time in front. Pure."""
    out = []
    offset = start
    i = bisect.bisect_right([size for size, _ in notes], offset)  # lines come in order: a cursor, not a search each
    for line in lines.splitlines(keepends=True):
        while i < len(notes) and notes[i][0] <= offset:
            i += 1
        out.append(f"{rfc3339(notes[i][1] if i < len(notes) else now)} {line.decode(errors='replace')}")
        offset += len(line)
    return "".join(out)


class LogClock:
    """Notes the growth of log files (`tick`, from a worker thread); one per runtime."""

    def __init__(self) -> None:
        self._sizes: dict[Path, int] = {}  # last size noted per log (read back from its index once)
        self._counts: dict[Path, int] = {}

    def tick(self, logs: Iterable[Path], now: float) -> None:
        for path in logs:
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                self.forget(path)
                continue
            index = times_path(path)
            if path not in self._sizes:
                notes = parse(index.read_text()) if index.exists() else []
                self._sizes[path], self._counts[path] = (notes[-1][0] if notes else 0), len(notes)
            last = self._sizes[path]
            if size == last:
                continue
            if size < last:  # replaced or truncated: its old times mean nothing now
                index.unlink(missing_ok=True)
                self._counts[path] = 0
            with open(index, "a") as f:
                f.write(f"{size} {now:.3f}\n")
            self._sizes[path] = size
            self._counts[path] += 1
            if self._counts[path] > MAX_NOTES:
                self._thin(index, path)

    def _thin(self, index: Path, path: Path) -> None:
        notes = thinned(parse(index.read_text()))
        tmp = index.with_name(index.name + ".tmp")
        tmp.write_text("".join(f"{size} {seen:.3f}\n" for size, seen in notes))
        os.replace(tmp, index)
        self._counts[path] = len(notes)

    def forget(self, path: Path) -> None:
        self._sizes.pop(path, None)
        self._counts.pop(path, None)


def read_notes(path: Path) -> list[Note]:
    try:
        return parse(times_path(path).read_text())
    except FileNotFoundError:
        return []


class NotingTask:
    """A runtime's clock: `LogClock.tick` over the files `logs()` names (called in a worker
    thread), every TICK_SECONDS, from the first `ensure` (the agent lists each runtime every
    pass) until `close`."""

    def __init__(self, logs: Callable[[], Iterable[Path]], what: str) -> None:
        self.logs, self.what = logs, what
        self.clock = LogClock()
        self._task: asyncio.Task[None] | None = None

    def ensure(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"log-clock {self.what}")

    def _tick(self) -> None:
        self.clock.tick(self.logs(), time.time())

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self._tick)
            except OSError as err:  # a full disk must not end the clock
                log.warning("noting the growth of %s failed: %s", self.what, err)
            await asyncio.sleep(TICK_SECONDS)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
