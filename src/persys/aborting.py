"""Typing for the code that ends a gRPC call with a status, so that mypy sees what follows it is
unreachable (no `raise AssertionError("unreachable")` after each use).

- `abort(context, code, message)`: grpc's `ServicerContext.abort`, which always raises, typed
  `NoReturn` (grpc ships no type hints: its own is `Any`).
- `@aborting` on an error-mapping async context manager (`contextlib.asynccontextmanager`): typed
  as one that never swallows an exception. It catches errors only to abort, and the abort raises;
  an `__aexit__` typed `-> bool` (as every asynccontextmanager's is) would make mypy assume the
  body may be skipped, so a method returning inside `async with mapped(context):` needed a dead
  `raise` after the block.

No gRPC import here: the context is whatever has an awaitable `abort` (grpc.aio's, a test's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Generic, NoReturn, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def abort(context: Any, code: Any, message: str) -> NoReturn:
    """End the call with `code` and `message` (grpc.aio raises AbortError from abort)."""
    await context.abort(code, message)
    raise RuntimeError(f"context.abort returned instead of raising ({code}: {message})")


class NeverSwallows(Generic[T]):
    """An async context manager that lets every exception out (the one it was given, or the abort
    that replaced it)."""

    def __init__(self, inner: AbstractAsyncContextManager[T]) -> None:
        self._inner = inner

    async def __aenter__(self) -> T:
        return await self._inner.__aenter__()

    async def __aexit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if await self._inner.__aexit__(typ, exc, tb):
            # A mapper that caught an error without aborting: the call must not go on as if the
            # body had run (the code after the block was typed unreachable).
            raise RuntimeError(f"an error-mapping context swallowed {exc!r}") from exc


def aborting(fn: Callable[P, AbstractAsyncContextManager[T]]) -> Callable[P, NeverSwallows[T]]:
    """Decorate an error-mapping async context manager factory (above @asynccontextmanager)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> NeverSwallows[T]:
        return NeverSwallows(fn(*args, **kwargs))

    return wrapper
