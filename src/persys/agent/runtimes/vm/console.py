"""A libvirt domain's serial console as a Terminal (`persysctl console`), through libvirt's console
API (what `virsh console` uses): libvirt owns the pty and lets one client attach at a time.

The agent registers no libvirt event loop, so the console's stream is non-blocking and one worker
thread pumps it: it sends what `write` queued, reads what the guest wrote, and when there is
nothing to read waits on the input queue for up to POLL_SECONDS (the worst added keystroke echo
latency). Output goes to the event loop through a bounded queue: a reader that does not keep up
makes the thread wait, never buffer more.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from typing import Any

from persys.agent.runtimes.base import RuntimeFailure
from persys.agent.runtimes.terminal import NO_EXIT_CODE, READ_MAX
from persys.agent.runtimes.vm.libvirt import err_code, lv_module

POLL_SECONDS = 0.02
_OUT_QUEUE = 16  # reads waiting for the caller, at most
_WOULD_BLOCK = -2  # what a non-blocking libvirt stream's recv and send answer instead of blocking


class LibvirtConsole:
    def __init__(self, stream: Any, target: str, loop: asyncio.AbstractEventLoop) -> None:
        self.target = target
        self._stream = stream
        self._loop = loop
        self._input: queue.Queue[bytes] = queue.Queue()
        self._output: asyncio.Queue[bytes] = asyncio.Queue(_OUT_QUEUE)
        self._stop = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._pump, name=f"console-{target}", daemon=True)
        self._thread.start()

    async def read(self) -> bytes:
        if self._ended:
            return b""
        data = await self._output.get()
        self._ended = not data
        return data

    async def write(self, data: bytes) -> None:
        if data:
            self._input.put(data)

    async def resize(self, cols: int, rows: int) -> None:
        """A serial port has no window size (`stty cols N rows M` in the guest sets one)."""

    async def close(self) -> int:
        self._stop.set()
        await asyncio.to_thread(self._thread.join)
        return NO_EXIT_CODE

    def _deliver(self, data: bytes) -> bool:
        """Hand `data` to the event loop, waiting while the caller is behind; False once closed."""
        fut = asyncio.run_coroutine_threadsafe(self._output.put(data), self._loop)
        while True:
            try:
                fut.result(timeout=0.5)
                return True
            except concurrent.futures.TimeoutError:
                if self._stop.is_set():
                    fut.cancel()
                    return False
            except RuntimeError:  # the loop is gone (the agent stops)
                return False

    def _pump(self) -> None:
        lv = lv_module()
        pending = b""
        try:
            while not self._stop.is_set():
                if pending:
                    sent = self._stream.send(pending)
                    if sent != _WOULD_BLOCK and sent > 0:
                        pending = pending[sent:]
                got = self._stream.recv(READ_MAX)
                if isinstance(got, bytes):
                    if not got or not self._deliver(got):  # b"": the domain's end closed (it stopped)
                        break
                    continue
                try:  # nothing to read now: wait for keystrokes, briefly
                    pending += self._input.get(timeout=0.001 if pending else POLL_SECONDS)
                except queue.Empty:
                    pass
        except lv.libvirtError:
            pass  # the domain went away under the console: the end, as for a stopped one
        finally:
            try:
                self._stream.abort()
            except lv.libvirtError:
                pass
            if not self._stop.is_set():
                self._deliver(b"")


def open_console(conn: Any, dom: Any, target: str, loop: asyncio.AbstractEventLoop) -> LibvirtConsole:
    """Attach to the domain's serial console (blocking: run in a thread). Refused while another
    client is attached (libvirt's safe mode), never stolen from it."""
    lv = lv_module()
    stream = conn.newStream(lv.VIR_STREAM_NONBLOCK)
    try:
        dom.openConsole(None, stream, lv.VIR_DOMAIN_CONSOLE_SAFE)
    except lv.libvirtError as exc:
        try:
            stream.abort()
        except lv.libvirtError:
            pass
        if err_code(exc) == lv.VIR_ERR_OPERATION_FAILED and "active console" in str(exc).lower():
            raise RuntimeFailure(f"{target}: another client is attached to the console", code="InUse") from exc
        if err_code(exc) == lv.VIR_ERR_OPERATION_INVALID:
            raise RuntimeFailure(f"{target} is not running", code="NotRunning") from exc
        raise RuntimeFailure(f"console of {target}: {exc}") from exc
    return LibvirtConsole(stream, target, loop)
