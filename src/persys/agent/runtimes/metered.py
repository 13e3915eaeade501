"""A runtime that counts and times the calls the agent makes to the one it wraps, by operation
and result (persys_agent_runtime_operations_total and its latency histogram). What the last
`list` showed is kept for the instance gauge. Everything else passes through."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from persys.agent.runtimes.base import ObservedWorkload, Probe, Runtime, RuntimeFailure, RuntimeWorkload
from persys.agent.runtimes.log_stream import LogQuery
from persys.observability.metrics import Metrics

T = TypeVar("T")


class MeteredRuntime:
    def __init__(self, inner: Runtime, metrics: Metrics) -> None:
        self.inner = inner
        self.name = inner.name
        self.listed = 0  # instances the last successful list() showed
        self._ops = metrics.counter("persys_agent_runtime_operations_total")
        self._seconds = metrics.histogram("persys_agent_runtime_operation_duration_seconds")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _timed(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        started = time.perf_counter()
        result = "error"
        try:
            value = await call()
            result = "ok"
            return value
        except RuntimeFailure as err:
            result = "terminal_error" if err.terminal else "error"
            raise
        finally:
            self._seconds.observe(time.perf_counter() - started, (self.name, op))
            self._ops.inc((self.name, op, result))

    async def probe(self) -> Probe:
        return await self.inner.probe()

    async def start(self, w: RuntimeWorkload) -> ObservedWorkload:
        return await self._timed("start", lambda: self.inner.start(w))

    async def stop(self, workload_id: str) -> None:
        await self._timed("stop", lambda: self.inner.stop(workload_id))

    async def remove(self, workload_id: str) -> None:
        await self._timed("remove", lambda: self.inner.remove(workload_id))

    async def list(self) -> list[ObservedWorkload]:
        seen = await self._timed("list", self.inner.list)
        self.listed = len(seen)
        return seen

    async def inspect(self, workload_id: str) -> ObservedWorkload | None:
        return await self._timed("inspect", lambda: self.inner.inspect(workload_id))

    async def logs(self, workload_id: str, tail: int = 100) -> str:
        return await self.inner.logs(workload_id, tail)

    def stream_logs(self, workload_id: str, query: LogQuery) -> AsyncIterator[str]:
        return self.inner.stream_logs(workload_id, query)

    async def close(self) -> None:
        await self.inner.close()
