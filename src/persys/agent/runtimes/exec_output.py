"""What a command run in an instance (`persysctl exec`) gave back, and the bound on it.

The command's stdout and stderr are kept up to one cap together; what comes after is read and
dropped (the command runs on: a full pipe would stall it) and the answer says it was cut.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from persys.agent.runtimes.supervision import children_of
from persys.model.limits import EXEC_OUTPUT_MAX_BYTES

STDOUT, STDERR = 1, 2


@dataclass(frozen=True)
class ExecOutput:
    exit_code: int
    stdout: bytes
    stderr: bytes
    truncated: bool = False
    timed_out: bool = False
    target: str = ""  # where it ran: a container's name, a process workload's pid


@dataclass
class OutputBuffer:
    cap: int = EXEC_OUTPUT_MAX_BYTES
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, stream: int, data: bytes) -> None:
        room = self.cap - len(self.stdout) - len(self.stderr)
        if len(data) > room:
            self.truncated = True
            data = data[:max(room, 0)]
        (self.stderr if stream == STDERR else self.stdout).extend(data)

    def result(self, exit_code: int, *, timed_out: bool, target: str) -> ExecOutput:
        return ExecOutput(exit_code, bytes(self.stdout), bytes(self.stderr), self.truncated, timed_out, target)


def exit_status(returncode: int) -> int:
    """A shell's view of how a process ended: its code, or 128 + the signal that killed it."""
    return 128 - returncode if returncode < 0 else returncode


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (found through /proc: they need not be ours)."""
    seen: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo.extend(children_of(p))
    for p in seen:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


@runtime_checkable
class Executes(Protocol):
    """A runtime that runs commands in its instances (`persysctl exec`)."""

    async def exec(self, workload_id: str, command: Sequence[str], *, service: str, kill_after: float,
                   stdin: bytes = b"") -> ExecOutput: ...


@runtime_checkable
class Copies(Protocol):
    """A runtime that copies files in and out of its instances (`persysctl cp`) as tar archives
    in files on the node."""

    async def copy_from(self, workload_id: str, path: str, dest: Path) -> int: ...

    async def copy_to(self, workload_id: str, path: str, archive: Path) -> str: ...
