"""An agent's metrics: its runtimes' calls (runtimes.metered), its gRPC server's calls, and at
scrape time the instances its runtimes showed, the desired set's size, whether it is connected,
and the node's utilization sampled for the last heartbeat (an agent's series are its node's).
Served on `--metrics-listen` / `--metrics-plain-listen` (security.metrics_access)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from persys.agent.runtimes.base import Runtime
from persys.agent.runtimes.metered import MeteredRuntime
from persys.observability.metrics import LoopCounter, Metrics, Sample


class AgentMetrics:
    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics or Metrics()
        self.passes: LoopCounter = self.metrics.counter("persys_agent_passes_total")
        self.node_usage: tuple[float, int, int] | None = None  # cpu %, memory MiB, disk MiB at the last heartbeat

    def wrap(self, runtimes: Sequence[Runtime]) -> list[Runtime]:
        return [MeteredRuntime(rt, self.metrics) for rt in runtimes]

    def install(self, runtimes: Callable[[], Sequence[Runtime]], desired: Callable[[], int],
                connected: Callable[[], bool]) -> None:
        def samples() -> Iterator[Sample]:
            for rt in runtimes():
                if isinstance(rt, MeteredRuntime):
                    yield "persys_agent_instances", (rt.name,), float(rt.listed)
            yield "persys_agent_desired_instances", (), float(desired())
            yield "persys_agent_connected", (), float(connected())
            if self.node_usage is not None:
                cpu, mem_mib, disk_mib = self.node_usage
                yield "persys_node_cpu_utilization_ratio", (), cpu / 100.0
                yield "persys_node_memory_used_bytes", (), float(mem_mib << 20)
                yield "persys_node_disk_used_bytes", (), float(disk_mib << 20)

        self.metrics.on_scrape(samples)
