"""The one way tests wait: poll a condition with a bound, never sleep a fixed time.

- `eventually(fn, timeout, what)`: blocking; polls `fn` (exceptions count as "not yet") until it
  returns something truthy; returns that value and the seconds it took.
- `until(cond, within, what)`: the same inside an event loop; `cond` may be a plain callable or a
  coroutine function; returns the seconds it took (tests print them: timings go to bench/).
- `settled(pred, within)`: polls an async `pred` until truthy or the bound passes and returns its
  last value either way, for tests that assert on the value themselves (a clearer message).
- `ready_then_stopped(argv, log)`: a server started, awaited until it says it is ready, stopped.

Bounds are generous on purpose: CI runs on two busy cores, where a condition reached in 50 ms on
an idle machine can take seconds. The time taken is returned so that a test can print it.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def eventually(fn: Callable[[], T | None], timeout: float = 10.0, what: str = "condition",
               interval: float = 0.1) -> tuple[T, float]:
    """Poll `fn` until it returns something truthy; returns it and the seconds it took."""
    t0 = time.monotonic()
    last_err: Exception | None = None
    while time.monotonic() - t0 < timeout:
        try:
            value = fn()
            if value:
                return value, time.monotonic() - t0
        except Exception as err:  # transient while things start
            last_err = err
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout}s (last error: {last_err})")


async def _check(cond: Callable[[], Any]) -> Any:
    value = cond()
    return await value if inspect.isawaitable(value) else value


async def until(cond: Callable[[], Any], within: float = 15.0, what: str = "condition",
                interval: float = 0.02, ignore: tuple[type[BaseException], ...] = ()) -> float:
    """Poll `cond` (sync or async) until it is truthy; seconds taken. `ignore`: exceptions that
    mean "not yet" (e.g. KeyError while an object is not there)."""
    t0 = time.monotonic()
    while True:
        try:
            if await _check(cond):
                return time.monotonic() - t0
        except ignore:
            pass
        if time.monotonic() - t0 > within:
            raise AssertionError(f"{what} not reached within {within}s")
        await asyncio.sleep(interval)


async def settled(pred: Callable[[], Awaitable[T]], within: float = 8.0, interval: float = 0.05) -> T:
    """Poll the async `pred` until truthy or `within` passed; its last value either way."""
    deadline = time.monotonic() + within
    while True:
        value = await pred()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval)


def ready_then_stopped(argv: list[str], log: Path, ready: str = "scheduler ready", timeout: float = 30.0,
                       env: dict[str, str] | None = None) -> str:
    """Start `argv` with its output in `log`, wait (bounded) until it prints `ready` or exits,
    stop it (SIGTERM, then SIGKILL) and return its output: for a server checked only at start."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + timeout
            while ready not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            text = log.read_text()
            assert ready in text, text[-2000:]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return log.read_text()


# The interval for a condition read by starting a process (persysctl: ~0.35 s of CPU each) that,
# once true, stays true (a line in a guest's console log): polled at 0.1 s, back to back, such a
# wait kept one of two cores busy while the TCG guest it waited for needed it to boot.
PROCESS_POLL = 1.0
