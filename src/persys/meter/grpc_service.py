"""The Meter gRPC service (proto/persys/v1/meter.proto): queries and window summaries over the
store. Who may call is checked before this by the scheduler's authorization interceptor (the
permission table: viewers read telemetry, nodes have no client rights)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import grpc
from typing_extensions import override

from persys._pb.persys.v1 import meter_pb2 as mpb
from persys._pb.persys.v1 import meter_pb2_grpc as mpb_grpc
from persys.events.samples import NODE, WORKLOAD
from persys.meter.query import METRIC_NAMES, Query, QueryError, check_window
from persys.meter.runner import Meter

_DASHED = {v: k for k, v in METRIC_NAMES.items()}
NOT_HERE = "Persys Meter does not run on this replica (started with --meter off)"


class MeterService(mpb_grpc.MeterServicer):
    def __init__(self, meter: Callable[[], Meter | None], status: Callable[[], dict[str, Any]],
                 clock: Callable[[], float] = time.time) -> None:
        self.meter = meter
        self.status = status  # the replica's meter view: samples published and dropped, ingest figures
        self.clock = clock

    async def _running(self, context: grpc.aio.ServicerContext) -> Meter:
        m = self.meter()
        if m is None:
            # A client tries the next replica, which may run the meter (persys.client).
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, NOT_HERE)
        assert m is not None
        return m

    def _window(self, since: float, until: float) -> tuple[float, float]:
        end = until or self.clock()
        start = end - since
        check_window(start, end)
        return start, end

    @override
    async def Query(self, request: mpb.MeterQueryRequest, context: grpc.aio.ServicerContext
                    ) -> mpb.MeterQueryResponse:
        m = await self._running(context)
        try:
            if request.metric not in METRIC_NAMES:
                raise QueryError("metric", f"must be one of {', '.join(METRIC_NAMES)}")
            start, end = self._window(request.since_seconds, request.until)
            q = Query(request.selector, request.value, METRIC_NAMES[request.metric], start, end,
                      request.step_seconds, request.agg or "avg")
            series = await m.store.query(q)
        except QueryError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return mpb.MeterQueryResponse(
            series=[mpb.MeterSeries(key=s.key, workload=s.workload, node=s.node, ts=[p[0] for p in s.points],
                                    values=[p[1] for p in s.points]) for s in series],
            engine=m.store.engine, start=start, end=end)

    @override
    async def Summary(self, request: mpb.MeterSummaryRequest, context: grpc.aio.ServicerContext
                      ) -> mpb.MeterSummaryResponse:
        m = await self._running(context)
        kinds = {"workloads": WORKLOAD, "nodes": NODE}
        try:
            if request.kind not in kinds:
                raise QueryError("kind", "must be workloads or nodes")
            start, end = self._window(request.since_seconds, 0.0)
            items = await m.store.summary(kinds[request.kind], start, end, request.limit or 500)
        except QueryError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return mpb.MeterSummaryResponse(
            items=[mpb.MeterUsage(name=i.name, node=i.node, samples=i.samples,
                                  avg={_DASHED[k]: v for k, v in i.avg.items()},
                                  max={_DASHED[k]: v for k, v in i.max.items()}) for i in items],
            engine=m.store.engine, start=start, end=end)

    @override
    async def Status(self, request: mpb.MeterStatusRequest, context: grpc.aio.ServicerContext
                     ) -> mpb.MeterStatusResponse:
        return mpb.MeterStatusResponse(json=json.dumps(self.status()).encode())
