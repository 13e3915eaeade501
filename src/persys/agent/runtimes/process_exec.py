"""`persysctl exec` for a process workload: a command run on the node in the workload's own
environment, which is not an isolated container.

The environment is read from the running instance itself (/proc/<pid>): its variables (secret
env included: they are in it), its working directory and its user and group. The command joins
the instance's cgroups through the same wrapper a start uses, so it counts against the workload's
limits and a stop of the workload ends it too. Its output is bounded; at the timeout its session
is killed.

An isolated instance (process_isolation.py) is entered, not imitated: the command runs through
`nsenter` in the namespaces of the instance's init (its PID, mount, IPC and network namespaces)
and takes the instance's ids there; the agent starts it as root for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from persys.agent.runtimes.base import RuntimeFailure
from persys.agent.runtimes.exec_output import STDERR, STDOUT, ExecOutput, OutputBuffer, exit_status, kill_tree
from persys.agent.runtimes.process_isolation import enter_argv, tool
from persys.agent.runtimes.supervision import children_of
from persys.agent.runtimes.terminal import READ_MAX

_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Isolated:
    """An isolated instance to enter: the ids it runs as (its record), its init's path and the
    file its environment is in (process_isolation.env_script)."""

    uid: int
    gid: int
    init: str
    env_file: str


@dataclass(frozen=True)
class ProcessContext:
    env: dict[str, str]
    cwd: str
    uid: int
    gid: int


def read_context(pid: int, settle: float = 2.0) -> ProcessContext:
    """The environment, working directory and user of a running process (blocking: /proc).

    A process workload always has an environment (PATH at least), but /proc/<pid>/environ reads
    empty while the process is inside an exec (the start's wrapper becoming the command): wait up
    to `settle` seconds for it, then refuse (NotRunning: try again) rather than run an exec with
    no environment at all."""
    deadline = time.monotonic() + settle
    try:
        while not (raw := Path(f"/proc/{pid}/environ").read_bytes()):
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"pid {pid} shows no environment (still starting?): try again",
                                     code="NotRunning")
            time.sleep(0.01)
        cwd = os.readlink(f"/proc/{pid}/cwd")
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as exc:
        raise RuntimeFailure(f"cannot read the environment of pid {pid}: {exc}") from exc
    env = dict(item.split("=", 1) for item in raw.decode(errors="surrogateescape").split("\0") if "=" in item)
    ids = {line.split(":", 1)[0]: line.split()[1] for line in status.splitlines() if line.startswith(("Uid:", "Gid:"))}
    return ProcessContext(env, cwd, int(ids.get("Uid", os.geteuid())), int(ids.get("Gid", os.getegid())))


def _user_kwargs(ctx: ProcessContext, isolated: Isolated | None = None) -> dict[str, Any]:
    if os.geteuid() == 0 and ctx.uid != 0 and isolated is None:  # isolated: nsenter switches inside
        return {"user": ctx.uid, "group": ctx.gid, "extra_groups": []}
    return {}


def _root_env(ctx: ProcessContext, isolated: Isolated | None, extra: dict[str, str] | None = None
              ) -> dict[str, str]:
    """The environment the exec's first process starts with. A host process's exec runs as its
    user from the start: its environment. An isolated one's starts as root (the cgroup wrapper,
    nsenter): a bare one, the instance's own read in only once its ids are taken."""
    if isolated is None:
        return {**ctx.env, **(extra or {})}
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM": "xterm"}


def namespace_init(pid: int, init: str, settle: float = 2.0) -> int:
    """The init of an isolated instance whose supervised process (`unshare`, outside) is `pid`,
    once it runs `init`: before that the namespaces are still being made (the private /proc not
    yet mounted, the ids not yet dropped), and nothing may enter them."""
    deadline = time.monotonic() + settle
    want = os.path.realpath(init)
    while True:
        for kid in children_of(pid):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{kid}/exe") == want:
                    return kid
        if time.monotonic() > deadline:
            raise RuntimeFailure(f"pid {pid} has no namespace init (still starting?): try again", code="NotRunning")
        time.sleep(0.01)


async def _prepare(pid: int, cgroup_tasks: Sequence[str], wrapper: str, command: Sequence[str],
                   isolated: Isolated | None) -> tuple[ProcessContext, list[str]]:
    """The context to run in and the command line (cgroup wrapper, namespaces) of an exec."""
    if isolated is None:
        ctx = await asyncio.to_thread(read_context, pid)
        argv = list(command)
    else:
        target = await asyncio.to_thread(namespace_init, pid, isolated.init)
        # The ids the instance was started with (its record), never what /proc shows right now.
        ctx = replace(await asyncio.to_thread(read_context, target), uid=isolated.uid, gid=isolated.gid)
        argv = enter_argv(target, isolated.uid, isolated.gid, list(command), isolated.env_file)
    if cgroup_tasks:
        argv = ["/bin/sh", "-c", wrapper, "persys-exec", *cgroup_tasks, "--", *argv]
    return ctx, argv


async def exec_in_process(pid: int, cgroup_tasks: Sequence[str], wrapper: str, command: Sequence[str],
                          kill_after: float, stdin: bytes = b"", *, isolated: Isolated | None = None) -> ExecOutput:
    ctx, argv = await _prepare(pid, cgroup_tasks, wrapper, command, isolated)
    out = OutputBuffer()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=ctx.cwd if isolated is None else "/", env=_root_env(ctx, isolated),
            start_new_session=True,
            **_user_kwargs(ctx, isolated))
    except FileNotFoundError:
        out.add(STDERR, f"persys: {command[0]}: command not found\n".encode())
        return out.result(127, timed_out=False, target=f"pid {pid}")
    except OSError as exc:
        raise RuntimeFailure(f"exec {command[0]!r}: {exc}") from exc

    async def pump(stream: asyncio.StreamReader | None, which: int) -> None:
        while stream is not None and (chunk := await stream.read(_CHUNK)):
            out.add(which, chunk)

    async def feed() -> None:  # beside the reading: a command that writes as it reads never blocks us
        if proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it stopped reading: its business
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        proc.stdin.close()

    timed_out = False
    try:
        await asyncio.wait_for(asyncio.gather(feed(), pump(proc.stdout, STDOUT), pump(proc.stderr, STDERR),
                                              proc.wait()), kill_after)
    except TimeoutError:
        timed_out = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its session: what it started in its group too
        await asyncio.to_thread(kill_tree, proc.pid)
        await proc.wait()
    return out.result(exit_status(proc.returncode or 0), timed_out=timed_out, target=f"pid {pid}")


class ProcessTerminal:
    """`persysctl exec -t` in a process workload's environment: the command on a fresh
    pseudo-terminal, in a session of its own whose controlling terminal it is (util-linux
    `setsid --ctty`: ^C and job control work). Closing it kills the command and what it started."""

    def __init__(self, proc: asyncio.subprocess.Process, master: int, target: str) -> None:
        self.proc = proc
        self.master = master
        self.target = target

    async def _ready(self, writer: bool) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        def ready() -> None:  # level-triggered: it may run again before this task resumes and removes it
            if not done.done():
                done.set_result(None)

        (loop.add_writer if writer else loop.add_reader)(self.master, ready)
        try:
            await done
        finally:
            (loop.remove_writer if writer else loop.remove_reader)(self.master)

    async def read(self) -> bytes:
        while True:
            try:
                return os.read(self.master, READ_MAX)
            except BlockingIOError:
                await self._ready(writer=False)
            except OSError as exc:
                if exc.errno == errno.EIO:  # every holder of the terminal's other end has gone
                    return b""
                raise

    async def write(self, data: bytes) -> None:
        while data:
            try:
                data = data[os.write(self.master, data):]
            except BlockingIOError:
                await self._ready(writer=True)
            except OSError as exc:
                if exc.errno == errno.EIO:
                    return  # the command has ended: keystrokes go nowhere, as on a closed terminal
                raise

    async def resize(self, cols: int, rows: int) -> None:
        with contextlib.suppress(OSError):
            _set_size(self.master, cols, rows)

    async def close(self) -> int:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its session's group (setsid made it leader)
            await asyncio.to_thread(kill_tree, self.proc.pid)
        await self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self.master)
        return exit_status(self.proc.returncode or 0)


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


async def open_process_tty(pid: int, cgroup_tasks: Sequence[str], wrapper: str, command: Sequence[str], cols: int,
                           rows: int, *, isolated: Isolated | None = None) -> ProcessTerminal:
    """Start `command` on a new pseudo-terminal in the process workload's environment, user and
    cgroups (as `exec_in_process`), sized `cols` x `rows` when given."""
    if isolated is None:
        ctx, argv = await _prepare(pid, cgroup_tasks, wrapper, command, None)
        argv = ["setsid", "--ctty", *argv]
    else:
        # The session (and the terminal's foreground group) is made inside the PID namespace: a
        # shell there gives the terminal back to a group it can see when it leaves.
        ctx, argv = await _prepare(pid, cgroup_tasks, wrapper, [tool("setsid"), "--ctty", *command], isolated)
    master, slave = os.openpty()
    try:
        if cols and rows:
            _set_size(slave, cols, rows)
        if os.geteuid() == 0 and ctx.uid != 0:
            os.fchown(slave, ctx.uid, ctx.gid)  # the user's own terminal, as a login gives it
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=slave, stdout=slave, stderr=slave, cwd=ctx.cwd if isolated is None else "/",
            start_new_session=isolated is not None,  # a group of its own to kill, as setsid gives outside
            env=_root_env(ctx, isolated, {"TERM": ctx.env.get("TERM") or "xterm"}), **_user_kwargs(ctx, isolated))
    except FileNotFoundError as exc:
        os.close(master)
        raise RuntimeFailure(f"exec -t: {exc.filename or 'setsid'} not found", code="InvalidArgument") from exc
    except OSError as exc:
        os.close(master)
        raise RuntimeFailure(f"exec {command[0]!r}: {exc}") from exc
    finally:
        os.close(slave)  # the command holds its own copy: when it ends, reading the master says EIO
    os.set_blocking(master, False)
    return ProcessTerminal(proc, master, f"pid {pid}")
