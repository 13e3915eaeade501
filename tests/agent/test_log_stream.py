"""Streaming file-based logs (process output, VM consoles) and merging compose services' streams
(persys.agent.runtimes.log_stream), on real files and real asyncio: the tail, then appended lines,
a truncated file read again from its start, the end when the file goes away, bounded pieces."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persys.agent.runtimes.log_stream import (
    ACCEPTED,
    READ_CHUNK,
    LogQuery,
    UnsupportedQuery,
    file_stream,
    merge_streams,
    split_lines,
)

POLL = 0.02


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


async def _next(stream: AsyncIterator[str], within: float = 5.0) -> str:
    return await asyncio.wait_for(anext(stream), within)


async def _until(stream: AsyncIterator[str], text: str, within: float = 5.0) -> str:
    seen, deadline = "", time.monotonic() + within
    while text not in seen:
        seen += await _next(stream, max(0.01, deadline - time.monotonic()))
    return seen


async def test_tail_then_follow_until_the_file_goes_away(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_text("".join(f"old {i}\n" for i in range(10)))
    stream = file_stream(log, LogQuery(tail=3, follow=True), "a process's output", poll=POLL)
    assert await _next(stream) == ACCEPTED
    assert await _next(stream) == "old 7\nold 8\nold 9\n"
    _append(log, b"new 1\nnew 2 without end")
    assert await _until(stream, "new 1\n") == "new 1\n"  # the partial line is held back
    _append(log, b"ed\n")
    assert await _until(stream, "ended") == "new 2 without ended\n"
    log.write_text("after truncation\n")  # shorter than what was read: read again from the start
    assert "after truncation" in await _until(stream, "after truncation")
    log.unlink()
    with pytest.raises(StopAsyncIteration):
        await _next(stream)


async def test_without_follow_only_the_tail(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text("a\nb\nc\n")
    pieces = [p async for p in file_stream(log, LogQuery(tail=2), "a VM's serial console")]
    assert "".join(pieces) == "b\nc\n"
    assert [p async for p in file_stream(tmp_path / "none.log", LogQuery(tail=2), "x")] == [ACCEPTED]


@pytest.mark.parametrize("query", [LogQuery(since=1.0), LogQuery(timestamps=True), LogQuery(service="db")])
async def test_what_a_file_cannot_answer_is_refused_before_anything(tmp_path: Path, query: LogQuery) -> None:
    with pytest.raises(UnsupportedQuery):
        await anext(file_stream(tmp_path / "stdout.log", query, "a process's output"))


def test_a_partial_line_is_held_only_up_to_a_bound() -> None:
    assert split_lines(b"ab", b"c\nde") == (b"abc\n", b"de")
    long = b"x" * READ_CHUNK
    assert split_lines(b"", long) == (long, b"")


async def test_a_fast_writer_is_read_in_bounded_pieces(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_text("started\n")
    stream = file_stream(log, LogQuery(tail=1, follow=True), "a process's output", poll=POLL)
    assert [await _next(stream), await _next(stream)] == [ACCEPTED, "started\n"]
    _append(log, (b"y" * 99 + b"\n") * 5000)
    got = 0
    while got < 500_000:
        piece = await _next(stream)
        assert len(piece) <= 2 * READ_CHUNK  # a held partial line and one read
        got += len(piece)
    await stream.aclose()  # type: ignore[attr-defined]


async def _source(name: str, n: int, done: list[str]) -> AsyncIterator[str]:
    try:
        for i in range(n):
            yield f"{name} {i}\n"
            await asyncio.sleep(0)
    finally:
        done.append(name)


async def test_merge_yields_every_piece_and_stops_every_source_when_left() -> None:
    done: list[str] = []
    got = [p async for p in merge_streams([_source("a", 3, done), _source("b", 2, done)])]
    assert sorted(got) == ["a 0\n", "a 1\n", "a 2\n", "b 0\n", "b 1\n"]
    done.clear()
    merged = merge_streams([_source("x", 10**6, done), _source("y", 10**6, done)])
    await anext(merged)
    await merged.aclose()  # type: ignore[attr-defined]
    assert sorted(done) == ["x", "y"]  # the reader left: no source keeps running


async def test_merge_raises_a_source_failure() -> None:
    async def broken() -> AsyncIterator[str]:
        yield "one\n"
        raise RuntimeError("engine gone")

    with pytest.raises(RuntimeError, match="engine gone"):
        _ = [p async for p in merge_streams([broken()])]
