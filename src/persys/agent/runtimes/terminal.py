"""Interactive terminals (`persysctl console`, `persysctl exec -t`): what a runtime hands the
agent's Attach call, one open terminal.

A console is a VM's serial port: detaching leaves the guest running. A TTY exec is a command on a
pseudo-terminal in a container, a compose service or a process workload's environment: closing it
kills the command. Either way the agent reads output as it comes and writes keystrokes as they
come; gRPC's flow control paces both ends, nothing is buffered beyond one read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

NO_EXIT_CODE = -1  # a console (or a command whose end was not seen) has no exit code
READ_MAX = 64 * 1024  # one read's bytes at most: an output message stays small


class Terminal(Protocol):
    """One open terminal. `read` and `write` may run concurrently; `close` ends both."""

    target: str  # what it is attached to, for the user: a domain, a container, a pid

    async def read(self) -> bytes:
        """The next output, as soon as there is some; b"" once the other end has gone."""
        ...

    async def write(self, data: bytes) -> None:
        """Keystrokes (or a paste), as typed."""
        ...

    async def resize(self, cols: int, rows: int) -> None:
        """The caller's window changed (a console's serial port has no size: ignored there)."""
        ...

    async def close(self) -> int:
        """Detach (console) or end the command (exec); its exit code, or NO_EXIT_CODE."""
        ...


@runtime_checkable
class HasConsole(Protocol):
    """A runtime whose instances have a serial console (VMs, microVMs)."""

    async def open_console(self, workload_id: str) -> Terminal: ...


@runtime_checkable
class HasTerminal(Protocol):
    """A runtime that runs commands on a TTY in its instances (`persysctl exec -t`)."""

    async def open_terminal(self, workload_id: str, command: Sequence[str], *, service: str, cols: int,
                            rows: int) -> Terminal: ...
