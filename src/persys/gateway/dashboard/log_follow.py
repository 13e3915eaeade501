"""A workload's logs on its page, followed live over the tab's one live connection (topic `logs`).

The page shows the last LOG_LINES lines of the first instance's output, each with the time the
agent gives it (`timestamps`), and remembers the newest time shown. The live connection then asks
the agent to follow from a little before that time (StreamLogs, `since`: RESUME_MARGIN earlier,
at most FOLLOW_TAIL lines of catch-up); each complete line goes to the browser as `event: log`
with its time. The newest lines' times are not stable (a file's output is timed by when the agent
first noted it, within a tick), so the browser aligns each new stream on the text: it skips what
comes up to the last lines it shows (static/app.js), and a reconnect repeats nothing. Bounded: one agent stream per live
connection, FOLLOWS_PER_CALLER per user and FOLLOWS_TOTAL per gateway; a line longer than
MAX_LINE characters is cut; lines are sent in batches of at most BATCH_LINES.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from fastapi.responses import JSONResponse

from persys._pb.persys.v1 import agent_pb2 as apb
from persys.agent_client import fetch_logs, stream_logs
from persys.client import SchedulerClient, SchedulerError
from persys.gateway.dashboard.html import Html, tag
from persys.gateway.routes.logs import instance_target
from persys.gateway.routes.stream_budget import StreamBudget, caller_key
from persys.tlsfiles import TLSFiles

LOG_LINES = 100
FOLLOW_TAIL = 500
RESUME_MARGIN = 2.0  # seconds: the agent's times of the newest output move by up to a tick (1 s)
MAX_LINE = 4000
BATCH_LINES = 200
FOLLOWS_PER_CALLER = 8
FOLLOWS_TOTAL = 256
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ?")


def split_stamped(line: str) -> tuple[str, str]:
    """(canonical time, text) of a line the agent prefixed with its RFC 3339 time: the fraction
    padded to 9 digits, so that times compare as strings (Docker trims trailing zeros, the agent's
    own notes do not); ("", line) when it carries none."""
    m = _STAMP.match(line)
    if not m:
        return "", line[:MAX_LINE]
    return f"{m.group(1)}.{(m.group(2) or '').ljust(9, '0')}Z", line[m.end():][:MAX_LINE]


def seconds_of(stamp: str) -> float:
    """The agent's `since` (seconds) for a canonical time: RESUME_MARGIN before it (the browser
    skips what it already shows), 0.0 for none."""
    if not stamp:
        return 0.0
    whole = dt.datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
    return max(0.0, whole + int(stamp[20:29]) / 1e9 - RESUME_MARGIN)


class LineBuffer:
    """Pieces of output in, complete lines out (the rest waits for its newline)."""

    def __init__(self) -> None:
        self._rest = ""

    def feed(self, piece: str) -> list[tuple[str, str]]:
        text = self._rest + piece
        *lines, self._rest = text.split("\n")
        if len(self._rest) > MAX_LINE * 4:  # a "line" that never ends: shown in pieces
            lines.append(self._rest)
            self._rest = ""
        return [split_stamped(x) for x in lines]


@dataclass(frozen=True)
class Shown:
    html: Html
    followable: bool


async def logs_section(client: SchedulerClient, agent_tls: TLSFiles | None, wid: str) -> Shown:
    """The last lines of the first instance's output, with where following them starts."""
    try:
        target = await instance_target(client, agent_tls, await client.get_workload(wid), wid, "", "logs")
    except SchedulerError as err:
        return Shown(tag("p", f"logs unavailable: {err.message}", class_="muted"), False)
    if isinstance(target, JSONResponse):
        why = str(json.loads(bytes(target.body)).get("error", ""))
        return Shown(tag("p", f"no logs to show: {why}", class_="muted", id="log-state"), False)
    assert agent_tls is not None  # instance_target answered 501 otherwise
    try:
        text = await fetch_logs(target.address, agent_tls, apb.LogsRequest(
            instance_id=target.instance, tail=LOG_LINES, timestamps=True), node_id=target.node)
    except grpc.aio.AioRpcError as err:
        return Shown(tag("p", f"agent on {target.node}: {err.details()}", class_="error", id="log-state"), False)
    lines = [split_stamped(x) for x in text.splitlines()]
    at = max((s for s, _ in lines), default="")
    if not at:  # nothing shown yet: follow from now
        at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000000000Z")
    body = "\n".join(t for _, t in lines)
    return Shown(tag("p", f"{target.instance} on {target.node}: the last {LOG_LINES} lines, then new ones as "
                          "they are written", class_="muted", id="log-state") +
                 tag("pre", body + ("\n" if body else ""), class_="logs", id="log-lines", data_log_at=at,
                     tabindex="0", aria_label="output"), True)


class LogFollows:
    """The agent streams the gateway's live connections follow (bounded per user and in all)."""

    def __init__(self, client: SchedulerClient, agent_tls: TLSFiles | None) -> None:
        self.client = client
        self.agent_tls = agent_tls
        self.budget = StreamBudget(FOLLOWS_PER_CALLER, FOLLOWS_TOTAL, "follow", "logs")

    async def start(self, wid: str, since: str, queue: asyncio.Queue[str]) -> asyncio.Task[None]:
        """A task pumping `event: log` frames (or one `event: logend` saying why not) into `queue`;
        it ends only when cancelled (the stream's end is not the live connection's)."""
        return asyncio.create_task(self._pump(wid, since, queue, caller_key()))

    async def _pump(self, wid: str, since: str, queue: asyncio.Queue[str], who: str) -> None:
        why = await self._follow(wid, since, queue, who)
        await queue.put(f"event: logend\ndata: {json.dumps({'reason': why})}\n\n")
        await asyncio.Event().wait()  # idle until the live connection closes

    async def _follow(self, wid: str, since: str, queue: asyncio.Queue[str], who: str) -> str:
        refusal = self.budget.refusal(who)
        if refusal:
            return refusal
        try:
            target = await instance_target(self.client, self.agent_tls, await self.client.get_workload(wid), wid,
                                           "", "logs")
        except SchedulerError as err:
            return err.message
        if isinstance(target, JSONResponse):
            return str(json.loads(bytes(target.body)).get("error", ""))
        assert self.agent_tls is not None
        request = apb.LogsRequest(instance_id=target.instance, tail=FOLLOW_TAIL, since=seconds_of(since),
                                  timestamps=True)
        with self.budget.slot(who):
            stream = stream_logs(target.address, self.agent_tls, request, node_id=target.node)
            try:
                return await _relay(stream, queue, target.instance, target.node)
            except grpc.aio.AioRpcError as err:
                return f"agent on {target.node}: {err.details()}"
            finally:
                await stream.aclose()


async def _relay(stream: AsyncIterator[str], queue: asyncio.Queue[str], instance: str, node: str) -> str:
    lines = LineBuffer()
    async for piece in stream:
        got = lines.feed(piece)
        for at in range(0, len(got), BATCH_LINES):
            batch = [[s, t] for s, t in got[at:at + BATCH_LINES]]
            await queue.put(f"event: log\ndata: {json.dumps({'lines': batch}, separators=(',', ':'))}\n\n")
    return f"{instance} is gone from {node}"
