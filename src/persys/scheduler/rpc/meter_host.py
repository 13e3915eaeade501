"""Persys Meter inside a scheduler process (`--meter`): the sample bus the replica publishes on,
and, where configured, the meter itself (store, ingester, maintenance) and its gRPC service.
A replica started with a store publishes its agents' samples and runs the meter; with
`publish` it only publishes (for a meter another replica runs); with `off` neither."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from persys._pb.persys.v1 import meter_pb2_grpc
from persys.events import open_samples
from persys.events.base import EventBus
from persys.events.redis_stream import RedisEventBus
from persys.events.samples import SampleBus
from persys.meter.config import check_spec, open_meter_store
from persys.meter.grpc_service import MeterService
from persys.meter.query import Retention
from persys.meter.runner import Meter
from persys.observability.health_checks import CheckResult, NamedCheck


async def start_meter(spec: str, retention: Retention | None, events: EventBus, data_dir: Path,
                      replica_id: str, is_active: Callable[[], bool]) -> tuple[SampleBus | None, Meter | None]:
    """The bus samples go to (None: `off`, or nobody could read them) and the meter, if this
    process runs it. `off` costs the report path nothing: no samples are even built."""
    check_spec(spec)
    if spec == "off":
        return None, None
    if spec == "publish":
        if not isinstance(events, RedisEventBus):
            raise ValueError("--meter publish needs the Redis event bus (--events redis://...): an in-process "
                             "ring reaches no other replica")
        return open_samples(events), None
    store = await asyncio.to_thread(open_meter_store, spec, data_dir, retention)
    assert store is not None
    bus = open_samples(events)
    # Files (DuckDB, chDB) have this process as their only writer; a ClickHouse server shared by
    # replicas is rolled up by the active one alone.
    local = not spec.startswith("clickhouse:")
    meter = Meter(store, bus, f"meter-{replica_id}", may_maintain=(lambda: True) if local else is_active)
    meter.start()
    return bus, meter


def serve_meter(server: grpc.aio.Server, meter: Meter | None, status: Callable[[], dict[str, Any]]) -> None:
    """The Meter service on every replica: where no meter runs, queries answer FAILED_PRECONDITION, so
    clients try the next replica; `status` is the replica's meter view (Scheduler.meter_view)."""
    meter_pb2_grpc.add_MeterServicer_to_server(MeterService(lambda: meter, status), server)


def meter_check(meter: Meter) -> NamedCheck:
    """Health's check of Persys Meter in this process: ingest keeping up, the store writable."""

    async def check() -> CheckResult:
        st = meter.status()
        return CheckResult(bool(st["ok"]), st["detail"] or f"{st['engine']}: {st['ingestedSamples']} samples ingested")

    return NamedCheck("meter", check)
