"""persysctl's live streams: `events --follow` and `get -w`, over the gateway's Server-Sent Events.

A dropped connection is retried with a one-line notice and resumed after the last event id seen
(`Last-Event-ID`), so nothing is shown twice or skipped; an `event: gap` from the server (the
resume id is older than what the bus retains) is shown as a warning. A stream the server ends
on its `timeout` is reopened silently. Ctrl-C ends quietly with exit code 0.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from persys.cli.ctl.api import Api, err_console, fail, refusal_text
from persys.security import peer_names

STREAM_SECONDS = 300  # each request; reopened when the server ends it
READ_TIMEOUT = 45.0  # the server sends a keep-alive every 15 s: three missed means the link is gone
MAX_BACKOFF = 2.0  # between reconnection attempts: a gateway restart is seconds


@dataclass
class Frame:
    event: str = ""
    id: str | None = None
    data: list[str] = field(default_factory=list)


class SseParser:
    """Server-Sent Events, one line at a time (the text/event-stream rules persysctl needs:
    `event`, `id`, `data`, comments; a blank line ends a frame)."""

    def __init__(self) -> None:
        self._frame = Frame()

    def feed(self, line: str) -> Frame | None:
        if line == "":
            done, self._frame = self._frame, Frame()
            return done if done.data or done.id is not None else None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._frame.event = value
        elif name == "id":
            self._frame.id = value
        elif name == "data":
            self._frame.data.append(value)
        return None


class StreamRefused(Exception):
    """The gateway answered with an error status (a bad filter, no permission): not retried."""


def frames(api: Api, path: str, params: dict[str, Any], last_id: str = "") -> Iterator[Frame]:
    """The frames of one request (raises httpx errors on a broken connection)."""
    headers = {"last-event-id": last_id} if last_id else {}
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT)
    with api.http.stream("GET", path, params=params, headers=headers, timeout=timeout,
                         extensions={"sni_hostname": peer_names.GATEWAY}) as resp:
        if resp.status_code >= 400:
            resp.read()
            raise StreamRefused(refusal_text(resp))
        parser = SseParser()
        for line in resp.iter_lines():
            frame = parser.feed(line)
            if frame is not None:
                yield frame


def follow_events(api: Api, params: dict[str, Any], since_id: str, show: Callable[[dict[str, Any]], None]) -> None:
    """Print events as they come until Ctrl-C, resuming after the last id on a dropped connection."""
    last, backoff = since_id, 0.5
    try:
        while True:
            try:
                for frame in frames(api, "/v1/events/stream", {**params, "timeout": STREAM_SECONDS}, last):
                    backoff = 0.5
                    if frame.event == "gap":
                        err_console.print(f"warning: {json.loads(''.join(frame.data))['gap']}", markup=False,
                                          highlight=False)
                    elif frame.event == "error":
                        raise httpx.ReadError(json.loads("".join(frame.data)).get("error", "stream ended"))
                    elif frame.data:
                        show(json.loads("\n".join(frame.data)))
                    if frame.id:
                        last = frame.id
            except StreamRefused as err:
                fail(str(err))
            except httpx.HTTPError as err:
                err_console.print(f"connection to {api.base} lost ({err or type(err).__name__}); resuming after "
                                  f"event {last or '(none yet)'}", markup=False, highlight=False)
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
    except KeyboardInterrupt:
        return


def follow_objects(api: Api, kind: str, params: dict[str, Any], show: Callable[[str, dict[str, Any]], None]) -> None:
    """Print a row per change of workloads or nodes until Ctrl-C. After a reconnection the server
    sends the current set again; rows already shown unchanged are not printed twice."""
    seen: dict[str, str] = {}
    backoff = 0.5
    try:
        while True:
            try:
                for frame in frames(api, f"/v1/watch/{kind}", {**params, "timeout": STREAM_SECONDS}):
                    backoff = 0.5
                    if not frame.data or frame.event in ("synced", "error"):
                        continue
                    change = json.loads("\n".join(frame.data))
                    text = json.dumps(change.get("object"), sort_keys=True)
                    if seen.get(change["id"]) == text:
                        continue
                    seen[change["id"]] = text
                    if change["type"] == "DELETED":
                        seen.pop(change["id"], None)
                    show(change["type"], change.get("object") or {"id": change["id"], "name": change["id"]})
            except StreamRefused as err:
                fail(str(err))
            except httpx.HTTPError as err:
                err_console.print(f"connection to {api.base} lost ({err or type(err).__name__}); reconnecting",
                                  markup=False, highlight=False)
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
    except KeyboardInterrupt:
        return
