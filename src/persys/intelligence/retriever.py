"""The evidence retriever: the one part of Intelligence that does I/O.

It reads through the client API (`persys.client.SchedulerClient`, the calls the gateway makes for
any REST caller) as its own identity, `user:persys-intelligence` in `persys:viewers`: whatever a
rule concludes, nothing it runs can change the cluster, because the scheduler checks every call
against that identity's role (tests/intelligence/test_retriever.py has a mutation refused).
The identity travels as the gateway's forwarded caller (security.forwarding), so the scheduler
believes it only from a gateway, as for any user the gateway serves.

Every read is bounded (events: the last 100 about the subject; explain: at most 16 nodes; logs:
the last 40 lines of at most 3 instances; meter: the last hour at 1 minute), and a read that
fails or finds nothing is recorded in `looked_at`, never raised: an investigation says what it
could not see.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Protocol

from persys.client import SchedulerError
from persys.intelligence.evidence import Document, Event, Evidence, LogExcerpt, Series
from persys.intelligence.rules_workload import nodes_of
from persys.security import forwarding
from persys.security.identity import Identity, Kind

IDENTITY = Identity(Kind.USER, "persys-intelligence", ("persys:viewers",))
EVENT_LIMIT = 100
EXPLAIN_NODES = 16
LOG_LINES = 40
LOG_INSTANCES = 3
METER_WINDOW = 3600.0
METER_STEP = 60


class ReadApi(Protocol):
    """The reads the retriever makes: a subset of SchedulerClient (no method here writes)."""

    async def get_workload(self, workload_id: str) -> dict[str, Any]: ...
    async def get_node(self, node_id: str) -> dict[str, Any]: ...
    async def list_workloads(self, node_id: str = "") -> list[dict[str, Any]]: ...
    async def list_nodes(self) -> list[dict[str, Any]]: ...
    async def events(self, limit: int = 100, subject: str = "") -> list[dict[str, Any]]: ...
    async def explain(self, workload_id: str, node_id: str = "") -> dict[str, Any]: ...
    async def health(self, as_self: bool = False) -> dict[str, Any]: ...
    async def meter_query(self, selector: str, value: str, metric: str, since: float, step: int, agg: str
                          ) -> dict[str, Any]: ...
    async def plan_operation(self, operation: dict[str, Any]) -> dict[str, Any]: ...  # a what-if: writes nothing
    async def list_automation_policies(self) -> dict[str, Any]: ...


class LogSource(Protocol):
    """An instance's last output lines, or None when it cannot be read (no agent endpoint)."""

    async def tail(self, workload: dict[str, Any], instance: str, lines: int) -> str | None: ...


def metadata() -> forwarding.Metadata:
    return forwarding.metadata_for(IDENTITY, None, f"intelligence-{uuid.uuid4().hex[:12]}")


@asynccontextmanager
async def as_intelligence() -> AsyncIterator[None]:
    """Calls made inside are made as the intelligence identity, whoever asked the gateway."""
    token = forwarding.forward(metadata())
    try:
        yield
    finally:
        forwarding.reset(token)


def _epoch(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _event(raw: dict[str, Any]) -> Event:
    return Event(str(raw.get("id", "")), _epoch(raw.get("ts", 0)), str(raw.get("kind", "")),
                 str(raw.get("subject", "")), str(raw.get("reason", "") or ""), str(raw.get("message", "") or ""),
                 dict(raw.get("fields") or {}))


class Retriever:
    def __init__(self, api: ReadApi, logs: LogSource | None = None, clock: Callable[[], float] = time.time) -> None:
        self.api, self.logs, self.clock = api, logs, clock

    async def _health(self, docs: list[Document], looked: list[str]) -> int:
        try:
            h = await self.api.health()
        except SchedulerError as err:
            looked.append(f"health: {err.code}: {err}")
            return 0
        rev = int((h.get("mirror") or {}).get("revision", 0) or 0)
        docs.append(Document("health", "scheduler", str(rev), h))
        return rev

    async def _events(self, subject: str, looked: list[str]) -> list[Event]:
        try:
            raw = await self.api.events(EVENT_LIMIT, subject)
        except SchedulerError as err:
            looked.append(f"events about {subject}: {err.code}: {err}")
            return []
        if not raw:
            looked.append(f"events about {subject}: none retained")
        return [_event(e) for e in raw]

    async def _series(self, selector: str, name: str, metric: str, agg: str, looked: list[str]) -> list[Series]:
        try:
            ans = await self.api.meter_query(selector, name, metric, METER_WINDOW, METER_STEP, agg)
        except SchedulerError as err:
            looked.append(f"meter {selector}/{name} {metric}: {err.code}: {err}")
            return []
        out = [Series(f"{selector}/{name}", metric, agg, METER_STEP, _epoch(ans.get("start", 0)),
                      _epoch(ans.get("end", 0)), tuple((_epoch(p[0]), float(p[1])) for p in s.get("points") or ()),
                      str(s.get("key", ""))) for s in ans.get("series") or ()]
        if not any(s.points for s in out):
            looked.append(f"meter {selector}/{name} {metric}: no samples in the last {METER_WINDOW / 3600:.0f}h")
        return [s for s in out if s.points]

    async def _node_doc(self, node_id: str, rev: int, looked: list[str]) -> Document | None:
        try:
            return Document("node", node_id, str(rev), await self.api.get_node(node_id))
        except SchedulerError as err:
            looked.append(f"node/{node_id}: {err.code}: {err}")
            return None

    async def for_workload(self, name: str) -> Evidence:
        """Raises SchedulerError (NOT_FOUND) when there is no such workload: nothing to investigate."""
        async with as_intelligence():
            docs: list[Document] = []
            looked: list[str] = []
            rev = await self._health(docs, looked)
            view = await self.api.get_workload(name)
            doc = Document("workload", name, str(view.get("revision", "")), view)
            docs.append(doc)
            events = await self._events(f"workload/{name}", looked)
            insts = list(view.get("instances") or ())
            for n in sorted(nodes_of(view, events)):
                node = await self._node_doc(n, rev, looked)
                if node is not None:
                    docs.append(node)
                    events += [e for e in await self._events(f"node/{n}", looked)
                               if e.kind in ("NodeNotReady", "NodeLost", "NodeReady", "NodeDeleted")]
            if any(i.get("phase") == "Pending" for i in insts):
                docs += await self._explains(name, looked, rev, {d.name for d in docs if d.kind == "node"})
            series = await self._series("workload", name, "memory", "max", looked)
            series += await self._series("workload", name, "cpu", "avg", looked)
            logs = await self._logs(view, looked)
            return Evidence(self.clock(), tuple(docs), tuple(events), tuple(series), tuple(logs), tuple(looked))

    async def _explains(self, name: str, looked: list[str], rev: int, have: set[str]) -> list[Document]:
        """Each node's filter verdicts for a Pending workload; with them the node's own document
        where its runtime refused it (a runtime that exists but does not work says why there)."""
        try:
            nodes = await self.api.list_nodes()
        except SchedulerError as err:
            looked.append(f"nodes: {err.code}: {err}")
            return []
        views = {str(x.get("id", "")): x for x in nodes}
        out = []
        for n in sorted(views)[:EXPLAIN_NODES]:
            try:
                ans = await self.api.explain(name, n)
            except SchedulerError as err:
                looked.append(f"explain {name} at {n}: {err.code}: {err}")
                continue
            if ans.get("node"):
                out.append(Document("explain", name, n, ans["node"]))
                refused = {f.get("code") for f in ans["node"].get("filters") or () if not f.get("passed", True)}
                if refused & {"runtime_unsupported", "storage_driver_missing"} and n not in have:
                    out.append(Document("node", n, str(rev), views[n]))
        if len(nodes) > EXPLAIN_NODES:
            looked.append(f"explain {name}: {len(nodes) - EXPLAIN_NODES} nodes past the first {EXPLAIN_NODES} "
                          "not asked")
        return out

    async def _logs(self, view: dict[str, Any], looked: list[str]) -> list[LogExcerpt]:
        if self.logs is None:
            looked.append("logs: no log source here")
            return []
        failing = [i for i in view.get("instances") or () if i.get("node") and (
            i.get("phase") == "Failed" or int(i.get("restarts", 0) or 0) > 0)][:LOG_INSTANCES]
        out = []
        for inst in failing:
            name = str(inst.get("instance", ""))
            text = await self.logs.tail(view, name, LOG_LINES)
            lines = tuple((text or "").splitlines()[-LOG_LINES:])
            if not lines:
                looked.append(f"logs of {name}: none read")
                continue
            out.append(LogExcerpt(name, 1, lines))
        return out

    async def for_node(self, name: str) -> Evidence:
        async with as_intelligence():
            docs: list[Document] = []
            looked: list[str] = []
            rev = await self._health(docs, looked)
            docs.append(Document("node", name, str(rev), await self.api.get_node(name)))
            events = await self._events(f"node/{name}", looked)
            try:
                for w in await self.api.list_workloads(name):
                    docs.append(Document("workload", str(w.get("id", w.get("name", ""))),
                                         str(w.get("revision", "")), w))
            except SchedulerError as err:
                looked.append(f"workloads on {name}: {err.code}: {err}")
            series = await self._series("node", name, "cpu", "avg", looked)
            series += await self._series("node", name, "memory", "max", looked)
            return Evidence(self.clock(), tuple(docs), tuple(events), tuple(series), (), tuple(looked))

    async def for_cluster(self) -> Evidence:
        async with as_intelligence():
            docs: list[Document] = []
            looked: list[str] = []
            rev = await self._health(docs, looked)
            try:
                docs += [Document("node", str(n.get("id", "")), str(rev), n) for n in await self.api.list_nodes()]
            except SchedulerError as err:
                looked.append(f"nodes: {err.code}: {err}")
            return Evidence(self.clock(), tuple(docs), (), (), (), tuple(looked))


MAX_POINTS = 4000


def step_for(window: float) -> int:
    """The finest meter step giving at most MAX_POINTS points over `window` (whole minutes past a
    minute and whole hours past an hour, so the meter answers from its rollups)."""
    step = max(10, -(-int(window) // MAX_POINTS))
    step = -(-step // 10) * 10
    if step > 60:
        step = -(-step // 60) * 60
    if step > 3600:
        step = -(-step // 3600) * 3600
    return step


class MeterReads(Protocol):
    async def meter_query(self, selector: str, value: str, metric: str, since: float, step: int, agg: str
                          ) -> dict[str, Any]: ...


async def read_series(api: MeterReads, selector: str, name: str, metric: str, agg: str, window: float
                      ) -> tuple[list[Series], list[str]]:
    """The meter's series over `window` at step_for(window), as whoever `api` calls as (the
    UsageReader as Intelligence; the automation's disk forecasts as the automation), and what
    could not be read."""
    step = step_for(window)
    looked: list[str] = []
    try:
        ans = await api.meter_query(selector, name, metric, window, step, agg)
    except SchedulerError as err:
        return [], [f"meter {selector}/{name} {metric}: {err.code}: {err}"]
    start, end = _epoch(ans.get("start", 0)), _epoch(ans.get("end", 0))
    out = [Series(f"{selector}/{name}", metric, agg, step, start, end,
                  tuple((_epoch(p[0]), float(p[1])) for p in s.get("points") or ()), str(s.get("key", "")))
           for s in ans.get("series") or ()]
    out = [s for s in out if s.points]
    if not out:
        looked.append(f"meter {selector}/{name} {metric}: no samples in the window")
    return out, looked


class UsageReader:
    """Meter history for rightsizing and forecasts, read as the intelligence identity."""

    def __init__(self, api: ReadApi) -> None:
        self.api = api

    async def series(self, selector: str, name: str, metric: str, agg: str, window: float
                     ) -> tuple[list[Series], list[str]]:
        async with as_intelligence():
            return await read_series(self.api, selector, name, metric, agg, window)

    async def workload(self, name: str) -> dict[str, Any]:
        async with as_intelligence():
            return await self.api.get_workload(name)

    async def events(self, subject: str) -> list[Event]:
        async with as_intelligence():
            try:
                return [_event(e) for e in await self.api.events(EVENT_LIMIT, subject)]
            except SchedulerError:
                return []

    async def nodes(self) -> list[dict[str, Any]]:
        async with as_intelligence():
            return await self.api.list_nodes()

    async def policies(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The automation policies (a viewer may read them), or what kept them from being read."""
        async with as_intelligence():
            try:
                return list((await self.api.list_automation_policies()).get("items") or ()), []
            except SchedulerError as err:
                return [], [f"automation policies: {err.code}: {err}"]

    async def workloads(self) -> list[dict[str, Any]]:
        async with as_intelligence():
            return await self.api.list_workloads()
