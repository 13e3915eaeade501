"""A microVM's serial console as a Terminal (`persysctl console`): the QEMU backend's console
chardev is a unix socket that QEMU serves one client at a time (while nobody is attached, output
goes only to the console log). The agent is that socket's only client, so it also refuses a
second attachment itself instead of leaving it queued behind the first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from persys.agent.runtimes.base import RuntimeFailure
from persys.agent.runtimes.terminal import NO_EXIT_CODE, READ_MAX


class SocketConsole:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: str,
                 on_close: Callable[[], None]) -> None:
        self.target = target
        self._reader, self._writer = reader, writer
        self._on_close = on_close

    async def read(self) -> bytes:
        try:
            return await self._reader.read(READ_MAX)
        except ConnectionError:
            return b""

    async def write(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionError):  # the VMM has gone: the read side ends the session
            self._writer.write(data)
            await self._writer.drain()

    async def resize(self, cols: int, rows: int) -> None:
        """A serial port has no window size."""

    async def close(self) -> int:
        self._on_close()
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
        return NO_EXIT_CODE


class ConsoleSockets:
    """Who is attached to which microVM's console, in this agent."""

    def __init__(self) -> None:
        self.attached: set[str] = set()

    async def open(self, workload_id: str, socket: Path, target: str) -> SocketConsole:
        if workload_id in self.attached:
            raise RuntimeFailure(f"{target}: another client is attached to the console", code="InUse")
        self.attached.add(workload_id)
        try:
            reader, writer = await asyncio.open_unix_connection(str(socket))
        except OSError as exc:
            self.attached.discard(workload_id)
            raise RuntimeFailure(f"the console of {target} is not reachable ({exc.strerror or exc}): "
                                 "a microVM started before consoles were sockets has none until restarted",
                                 code="NotRunning") from exc
        return SocketConsole(reader, writer, target, lambda: self.attached.discard(workload_id))
