"""Persys Intelligence's answers, whatever the transport: the REST routes
(gateway/intelligence_routes.py) and the gRPC service (gateway/intelligence_grpc.py) both call
this one object, so the two give the same documents, share one investigation record and check
input the same way. Bad input raises `BadInput` naming the parameter (REST 400, gRPC
INVALID_ARGUMENT); the scheduler's refusals pass through as SchedulerError."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from persys.intelligence.analyses import FORECAST_METRICS, forecast_usage, rightsize
from persys.intelligence.evidence import Evidence
from persys.intelligence.insights import insights
from persys.intelligence.narration import NarrationConfig, narrate
from persys.intelligence.record import InvestigationRecord
from persys.intelligence.retriever import Retriever, UsageReader, step_for
from persys.intelligence.why import why
from persys.meter.query import QueryError, seconds

MAX_FORECAST_POINTS = 5000
MAX_NAME = 253


class BadInput(ValueError):
    """A parameter the caller got wrong; the message starts with its name."""


def durations(**given: str) -> dict[str, float]:
    try:
        return {k: seconds(v, k) for k, v in given.items()}
    except QueryError as err:
        raise BadInput(str(err)) from None


class IntelligenceApi:
    def __init__(self, retriever: Retriever, reader: UsageReader, narration: NarrationConfig | None,
                 asked_by: Callable[[], str]) -> None:
        self.retriever, self.reader, self.narration, self.asked_by = retriever, reader, narration, asked_by
        self.record = InvestigationRecord()

    async def _answer(self, ev: Evidence, subject: str, narrate_it: bool) -> dict[str, Any]:
        investigation = why(ev, subject)
        entry = self.record.add(investigation, ev.now, self.asked_by())
        inv = investigation.to_dict()  # the findings are final before any narration is asked for
        out = {**inv, "evidence": ev.to_dict(), "record": entry["id"]}
        if narrate_it:
            out["narration"] = await narrate(inv, self.narration)
        return out

    async def why_workload(self, name: str, narrate_it: bool = False) -> dict[str, Any]:
        return await self._answer(await self.retriever.for_workload(name), f"workload/{name}", narrate_it)

    async def why_node(self, name: str, narrate_it: bool = False) -> dict[str, Any]:
        return await self._answer(await self.retriever.for_node(name), f"node/{name}", narrate_it)

    async def why_cluster(self, narrate_it: bool = False) -> dict[str, Any]:
        return await self._answer(await self.retriever.for_cluster(), "cluster", narrate_it)

    def investigations(self, subject: str, inconclusive: bool | None, limit: int) -> list[dict[str, Any]]:
        if len(subject) > 300:
            raise BadInput("subject: at most 300 characters")
        if not 1 <= limit <= 500:
            raise BadInput(f"limit: {limit} is not from 1 to 500")
        return self.record.list(subject, inconclusive, limit)

    async def insights(self) -> dict[str, Any]:
        return await insights(self.retriever, self.reader, rightsize)

    async def rightsize(self, name: str, since: str = "7d") -> dict[str, Any]:
        d = durations(since=since)
        return await rightsize(self.reader, name, d["since"])

    async def forecast(self, kind: str, name: str, metric: str = "cpu", since: str = "14d", horizon: str = "1d"
                       ) -> dict[str, Any]:
        """`kind` node (`name` the node) or cluster."""
        if metric not in FORECAST_METRICS:
            raise BadInput(f"metric: {metric!r} is not one of {', '.join(FORECAST_METRICS)}")
        d = durations(since=since, horizon=horizon)
        if d["horizon"] > d["since"] or d["horizon"] / step_for(d["since"]) > MAX_FORECAST_POINTS:
            raise BadInput(f"horizon: {horizon} is longer than the history it is fitted on ({since}) or would be "
                           f"over {MAX_FORECAST_POINTS} points")
        return await forecast_usage(self.reader, kind, name, metric, d["since"], d["horizon"])


def problem(err: BadInput) -> Mapping[str, Any]:
    """The REST error body of a BadInput (the shape the gateway's 400s have)."""
    return {"error": str(err), "code": "INVALID_ARGUMENT", "problems": [str(err)]}
