"""The samples a replica publishes for Persys Meter from what its agents report: per instance
(from reports) and per node (from heartbeats). Agents send cumulative disk and network byte
counters; the meter stores rates (bytes per second), so each key's previous counters are kept.
The bookkeeping is pure; `Telemetry.offer` hands samples to the outbox, which never blocks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from persys.events.sample_outbox import SampleOutbox
from persys.events.samples import NODE, WORKLOAD, Sample, label_text
from persys.model import NodeUsage, Workload, WorkloadUsage
from persys.model.workload import workload_of

SAMPLE_INTERVAL = 5.0  # at most one sample per instance or node this often (agents sample every 5 s)
FORGET_AFTER = 600.0  # counters of keys silent this long are dropped (bounded memory)
MAX_KEYS = 2_000_000


@dataclass(frozen=True, slots=True)
class Seen:
    ts: float
    counters: tuple[int, int, int, int]  # disk read, disk write, net rx, net tx (cumulative bytes)


def rates(prev: Seen | None, ts: float, counters: tuple[int, int, int, int]) -> tuple[float, ...]:
    """Bytes per second since the previous sample; 0 for the first one and after a counter reset
    (a restarted instance starts again from 0)."""
    if prev is None or ts <= prev.ts:
        return (0.0,) * 4
    dt = ts - prev.ts
    return tuple((c - p) / dt if c >= p else 0.0 for c, p in zip(counters, prev.counters, strict=True))


def due(prev: Seen | None, ts: float) -> bool:
    return prev is None or ts - prev.ts >= SAMPLE_INTERVAL


class Telemetry:
    def __init__(self, outbox: SampleOutbox | None, clock: Callable[[], float] = time.time) -> None:
        self.outbox = outbox
        self.clock = clock
        self._seen: dict[str, Seen] = {}
        self._swept = clock()

    def instances(self, node_id: str, measured: Iterable[tuple[str, WorkloadUsage]],
                  workload: Callable[[str], Workload | None]) -> None:
        """Samples of the instances a report measured (instance id, usage)."""
        if self.outbox is None:
            return
        now = self.clock()
        out = []
        for inst, u in measured:
            counters = (u.disk_read_bytes, u.disk_write_bytes, u.net_rx_bytes, u.net_tx_bytes)
            prev = self._seen.get(inst)
            if not due(prev, now):
                continue
            wid = workload_of(inst)
            w = workload(wid)
            self._seen[inst] = Seen(now, counters)
            dr, dw, rx, tx = rates(prev, now, counters)
            out.append(Sample(now, WORKLOAD, node_id, wid, inst, w.spec.type if w else "",
                              label_text(w.labels) if w else "", u.cpu_percent, float(u.memory_bytes),
                              dr, dw, rx, tx))
        self._offer(out, now)

    def node(self, node_id: str, usage: NodeUsage) -> None:
        if self.outbox is None:
            return
        now, key = self.clock(), "node/" + node_id
        if not due(self._seen.get(key), now):
            return
        counters = (usage.disk_read_bytes, usage.disk_write_bytes, usage.net_rx_bytes, usage.net_tx_bytes)
        dr, dw, rx, tx = rates(self._seen.get(key), now, counters)
        self._seen[key] = Seen(now, counters)
        self._offer([Sample(now, NODE, node_id, cpu=usage.cpu_percent,
                            memory=float(usage.memory_used_mb) * 1024 * 1024,
                            disk_read=dr, disk_write=dw, net_rx=rx, net_tx=tx,
                            disk_used=float(usage.disk_used_mb) * 1024 * 1024)], now)

    def _offer(self, samples: list[Sample], now: float) -> None:
        if samples and self.outbox is not None:
            self.outbox.offer(samples)
        if now - self._swept > FORGET_AFTER or len(self._seen) > MAX_KEYS:
            self._swept = now
            self._seen = {k: v for k, v in self._seen.items() if now - v.ts < FORGET_AFTER}
