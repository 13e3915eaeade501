"""persys.aborting: what the typing promises holds at run time. An error-mapping context lets
every exception out (the abort that replaced it, or the original one it does not map), never
swallows one; `abort` never returns."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from persys.aborting import abort, aborting


class Aborted(Exception):
    pass


class Context:
    """Stands in for grpc.aio.ServicerContext: its abort raises, as grpc's does."""

    def __init__(self, raises: bool = True) -> None:
        self.raises = raises
        self.aborted: list[tuple[str, str]] = []

    async def abort(self, code: str, message: str) -> None:
        self.aborted.append((code, message))
        if self.raises:
            raise Aborted(code)


@aborting
@contextlib.asynccontextmanager
async def mapped(context: Context) -> AsyncIterator[None]:
    try:
        yield
    except KeyError as err:
        await context.abort("NOT_FOUND", f"{err.args[0]} not found")


@aborting
@contextlib.asynccontextmanager
async def swallowing(context: Context) -> AsyncIterator[None]:
    try:
        yield
    except KeyError:
        pass  # a mapper gone wrong: it neither aborts nor raises


async def answer(context: Context, fail: BaseException | None) -> str:
    async with mapped(context):
        if fail is not None:
            raise fail
        return "answer"


async def test_a_mapped_error_becomes_the_abort() -> None:
    ctx = Context()
    with pytest.raises(Aborted):
        await answer(ctx, KeyError("web"))
    assert ctx.aborted == [("NOT_FOUND", "web not found")]


async def test_an_unmapped_error_goes_through_and_an_answer_is_returned() -> None:
    ctx = Context()
    with pytest.raises(ValueError, match="bad"):
        await answer(ctx, ValueError("bad"))
    assert await answer(ctx, None) == "answer" and ctx.aborted == []


async def test_a_swallowing_mapper_is_an_error_not_a_silent_success() -> None:
    with pytest.raises(RuntimeError, match="swallowed"):
        async with swallowing(Context()):
            raise KeyError("web")


async def test_abort_never_returns() -> None:
    ctx = Context(raises=False)  # a context whose abort returned would let the call go on
    with pytest.raises(RuntimeError, match="returned instead of raising"):
        await abort(ctx, "INTERNAL", "boom")
    with pytest.raises(Aborted):
        await abort(Context(), "INTERNAL", "boom")
