"""Supervised host processes, shared by the process runtime and the microVM VMMs.

A supervised process leads its own session and process group, so it outlives the agent and can be
killed as a unit. It is identified by pid plus the kernel's start time of that pid (/proc), so a
later agent that adopts it never mistakes a recycled pid for it, and it need not be our child.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from persys.agent.runtimes.user_spawn import popen_as

CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcInfo:
    state: str
    ppid: int
    pgid: int
    cpu_ticks: int  # utime + stime
    start_ticks: int  # field 22: with the pid, identifies one process across pid reuse
    rss_bytes: int


def proc_info(pid: int) -> ProcInfo | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may contain spaces and ')', so split after the last ')'; rest[N-3] is field N.
    rest = raw.rsplit(")", 1)[1].split()
    return ProcInfo(
        state=rest[0],
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        cpu_ticks=int(rest[11]) + int(rest[12]),
        start_ticks=int(rest[19]),
        rss_bytes=int(rest[21]) * _PAGE,
    )


def ticks_to_ns(ticks: int) -> int:
    return ticks * 1_000_000_000 // CLK_TCK


def is_alive(pid: int, start_ticks: int) -> bool:
    """True while `pid` is still the very process we started (not a zombie, not a recycled pid)."""
    info = proc_info(pid) if pid > 0 else None
    return info is not None and info.start_ticks == start_ticks and info.state not in ("Z", "X")


def _scan_proc(match: Callable[[ProcInfo], bool]) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            info = proc_info(int(entry.name))
            if info is not None and match(info):
                out.append(int(entry.name))
    return out


def children_of(pid: int) -> list[int]:
    with contextlib.suppress(OSError, ValueError):  # needs CONFIG_PROC_CHILDREN; else scan /proc
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return _scan_proc(lambda info: info.ppid == pid)


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (children, theirs, ...), found via /proc."""
    out, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        out += kids
        todo += kids
    return out


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, found via /proc since we may not be their parent."""
    return _scan_proc(lambda info: info.pgid == pgid and info.state != "Z")


def spawn_session(
    argv: list[str],
    *,
    cwd: Path | str,
    stdout: Path,
    stderr: Path | None = None,
    env: Mapping[str, str] | None = None,
    user: int | None = None,
    group: int | None = None,
    extra_groups: list[int] | None = None,
) -> subprocess.Popen[bytes]:
    """Starts `argv` leading its own session and process group, output appended to files
    (stderr to `stdout` when not given), as `user`/`group` when given (the agent's own
    otherwise; see user_spawn.py for how). Raises OSError when it cannot be started."""
    with open(stdout, "ab") as out, contextlib.ExitStack() as stack:
        err = stack.enter_context(open(stderr, "ab")) if stderr is not None else subprocess.STDOUT

        def popen(**switch: Any) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=None if env is None else dict(env),
                close_fds=True,
                start_new_session=True,  # own session + group: survives the agent, killable as a unit
                **switch,
            )

        return popen_as(user, group, extra_groups, cwd, popen)


async def wait_until(done: Callable[[], bool], within: float, *, poll: float = 0.05) -> bool:
    """Polls `done` (in a worker thread: it reads /proc) until true or `within` seconds passed."""
    deadline = time.monotonic() + within
    while True:
        if await asyncio.to_thread(done):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll)


async def terminate(
    send: Callable[[signal.Signals], None], gone: Callable[[], bool], *, grace: float, kill_after: float = 2.0
) -> bool:
    """SIGTERM, then SIGKILL whatever is left after `grace` seconds; True once `gone`.
    `send` delivers a signal to everything that belongs to the workload."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_after)):
        if await asyncio.to_thread(gone):
            return True
        send(sig)
        if await wait_until(gone, wait):
            return True
    return False
