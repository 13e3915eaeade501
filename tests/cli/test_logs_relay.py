"""The pieces of `logs -f` between the agent and persysctl that need no cluster: the gateway's
keep-alive relay (persys.gateway.routes.logs) and its per-caller budget, and persysctl's reading of
the frames. The whole path runs against a real cluster in tests/gateway/test_logs_follow.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from persys.cli.ctl.follow import SseParser
from persys.gateway.routes.logs import _with_keepalive
from persys.gateway.routes.stream_budget import StreamBudget


async def _slow(pieces: list[str], pause: float, closed: list[bool]) -> AsyncIterator[str]:
    try:
        for p in pieces:
            await asyncio.sleep(pause)
            yield p
    finally:
        closed.append(True)


async def test_silence_becomes_keepalives_and_every_piece_passes() -> None:
    closed: list[bool] = []
    got = [p async for p in _with_keepalive(_slow(["a\n", "b\n"], 0.12, closed), 0.05)]
    assert [p for p in got if p is not None] == ["a\n", "b\n"]
    assert got.count(None) >= 2  # a keep-alive per 0.05 s of silence
    assert closed == [True]


async def test_leaving_cancels_the_pending_read() -> None:
    closed: list[bool] = []
    relay = _with_keepalive(_slow(["never"], 60, closed), 0.01)
    assert await anext(relay) is None
    await relay.aclose()  # type: ignore[attr-defined]
    await asyncio.sleep(0)
    assert closed == [True]


def test_budget_per_caller_and_total() -> None:
    b = StreamBudget(per_caller=2, total=3, verb="follow", noun="logs")
    with b.slot("alice"), b.slot("alice"):
        assert "already follow 2" in b.refusal("alice")
        assert b.refusal("bob") == ""
        with b.slot("bob"):
            assert "3 logs already" in b.refusal("carol")
    assert not b.held and b.refusal("alice") == ""


@pytest.mark.parametrize("text", ["one line\n", "two\nlines\n", 'quotes " and \\ backslashes\n', "no newline"])
def test_a_log_frame_reads_back_as_its_text(text: str) -> None:
    frame_text = f"data: {json.dumps({'text': text})}\n\n"
    parser, frames = SseParser(), []
    for line in frame_text.split("\n"):
        f = parser.feed(line)
        if f is not None:
            frames.append(f)
    assert [json.loads("\n".join(f.data))["text"] for f in frames] == [text]
