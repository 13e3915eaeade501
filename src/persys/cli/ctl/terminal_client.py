"""persysctl's end of an interactive terminal (`console`, `exec -t`): a WebSocket to the gateway
(routes/terminal_routes.py) with the same credentials and gateway-name check as every request.

On a terminal, persysctl puts its own into raw mode (every key goes to the remote side, ^C
included) and restores it however the session ends; window size changes are sent as they happen.
A console is left with Ctrl-] (as `virsh console`); an exec -t ends when its command does.
Piped input (no terminal) is sent as it comes; at its end an exec -t sends ^D (end of input on a
TTY), and a console detaches once the output has been quiet for --linger seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import termios
import tty
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from persys.cli.ctl.api import Api, err_console, fail
from persys.cli.output import refusal
from persys.security import peer_names

ESCAPE = b"\x1d"  # Ctrl-]
END_OF_INPUT = b"\x04"  # ^D: what a TTY reads as the end of input
FRAME_MAX_BYTES = 1 << 20  # one message from the gateway, at most
UNKNOWN_EXIT = 1  # a session that ended without an exit code (console detached: 0)
_READ = 64 * 1024


@dataclass(frozen=True)
class Session:
    path: str  # /v1/workloads/NAME/console or /terminal
    params: list[tuple[str, str]]
    console: bool  # Ctrl-] leaves; piped input lingers instead of ending with ^D
    linger: float = 2.0


def window_size() -> tuple[int, int]:
    """(cols, rows) of persysctl's terminal, (0, 0) when it has none."""
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except OSError:
        return 0, 0
    return size.columns, size.lines


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[bool]:
    """Raw mode on `fd` while inside, when it is a terminal (yields whether it is)."""
    if not os.isatty(fd):
        yield False
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run(api: Api, session: Session) -> int:
    """Hold the session until it ends; the exit code to leave with."""
    parts = urlsplit(api.base)
    uri = f"{'wss' if parts.scheme == 'https' else 'ws'}://{parts.netloc}{session.path}?{urlencode(session.params)}"
    try:
        return asyncio.run(_hold(uri, api, session))
    except InvalidStatus as err:  # refused before the handshake completed: the gateway's answer
        fail(refusal.refusal_text(bytes(err.response.body or b""), err.response.reason_phrase))
    except Unreachable as err:
        fail(f"cannot reach the Persys gateway at {api.base} ({err.__cause__ or err})")
    except WebSocketException as err:
        fail(f"the terminal connection to {api.base} failed: {err}")


class Unreachable(Exception):
    """The gateway could not be connected to (its cause says why)."""


async def _hold(uri: str, api: Api, session: Session) -> int:
    try:
        ws = await connect(uri, ssl=api.ssl_context, server_hostname=peer_names.GATEWAY,
                           additional_headers=api.headers, max_size=FRAME_MAX_BYTES, open_timeout=30,
                           ping_interval=20)
    except (OSError, TimeoutError) as err:  # refused, no route, TLS, the handshake's timeout
        raise Unreachable() from err
    async with ws:
        hello = json.loads(await ws.recv())
        if not hello.get("ready"):
            fail(str(hello.get("error") or "the gateway did not open the terminal"))
        stdin = sys.stdin.fileno()
        with raw_terminal(stdin) as on_tty:
            if session.console:
                leave = "Ctrl-] leaves" if on_tty else "piped input"
                _say(f"connected to the console of {hello['instance']} on {hello['node']} ({leave})", on_tty)
            return await _pump(ws, session, stdin, on_tty)


def _say(text: str, on_tty: bool) -> None:
    err_console.print(text + ("\r" if on_tty else ""), markup=False, highlight=False)


async def _pump(ws: ClientConnection, session: Session, stdin: int, on_tty: bool) -> int:
    loop = asyncio.get_running_loop()
    if on_tty:
        loop.add_signal_handler(signal.SIGWINCH, lambda: loop.create_task(_send_size(ws)))
    quiet = asyncio.Event()  # piped console: set when the input ended and the output went quiet
    sender = asyncio.create_task(_send_input(ws, session, stdin, on_tty, quiet))
    try:
        outcome = await _receive(ws, session, quiet, sender)
    finally:
        sender.cancel()
        if on_tty:
            loop.remove_signal_handler(signal.SIGWINCH)
        with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
            await sender
    if "error" in outcome:
        _say(f"persysctl: {outcome['error']}", on_tty)
        return UNKNOWN_EXIT
    if outcome.get("detached"):
        return 0
    code = int(outcome.get("exitCode", -1))
    if session.console:
        _say(f"persysctl: {outcome.get('detail') or 'the console closed'}", on_tty)
        return 0
    return code if code >= 0 else UNKNOWN_EXIT


async def _send_size(ws: ClientConnection) -> None:
    cols, rows = window_size()
    if cols and rows:
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps({"cols": cols, "rows": rows}))


async def _send_input(ws: ClientConnection, session: Session, stdin: int, on_tty: bool, quiet: asyncio.Event
                      ) -> str:
    """Keystrokes to the gateway until Ctrl-] ("detached", console on a terminal) or the input's end."""
    async for data in _input_pieces(stdin):
        if session.console and on_tty and ESCAPE in data:
            return "detached"
        await ws.send(data)
    if not session.console:
        await ws.send(END_OF_INPUT)
    else:
        quiet.set()  # piped console: the receiver detaches once the output goes quiet
    return "end of input"


async def _input_pieces(stdin: int) -> AsyncIterator[bytes]:
    """What arrives on `stdin`, as it arrives, until its end. A terminal or a pipe is watched by
    the event loop: one read per wake-up, in the callback (the descriptor is blocking, and only
    there is it known to be readable), and no more until that piece is sent. A file (or
    /dev/null), which epoll cannot watch and which never blocks, is read in a worker thread."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[bytes] = asyncio.Queue()

    def readable() -> None:
        loop.remove_reader(stdin)
        try:
            data = os.read(stdin, _READ)
        except OSError:
            data = b""
        pieces.put_nowait(data)

    try:
        loop.add_reader(stdin, readable)
    except PermissionError:
        while data := await asyncio.to_thread(os.read, stdin, _READ):
            yield data
        return
    try:
        while data := await pieces.get():
            yield data
            loop.add_reader(stdin, readable)
    finally:
        loop.remove_reader(stdin)


async def _receive(ws: ClientConnection, session: Session, quiet: asyncio.Event, sender: asyncio.Task[str]
                   ) -> dict[str, Any]:
    """Output to stdout until the session ends; how it ended."""
    out = sys.stdout.buffer
    while True:
        wait = session.linger if quiet.is_set() else None
        recv = asyncio.ensure_future(ws.recv())
        done, _ = await asyncio.wait({recv, sender} if not sender.done() else {recv}, timeout=wait,
                                     return_when=asyncio.FIRST_COMPLETED)
        if recv not in done:
            recv.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await recv
            if sender.done() and sender.result() == "detached":
                return {"detached": True}
            if quiet.is_set() and not done:
                return {"detached": True}  # piped console: quiet for --linger seconds after the input
            continue
        try:
            msg = recv.result()
        except ConnectionClosed:
            return {"error": "the gateway closed the connection"}
        if isinstance(msg, bytes):
            out.write(msg)
            out.flush()
            continue
        control = json.loads(msg)
        if control.get("ended") or "error" in control:
            return dict(control)
