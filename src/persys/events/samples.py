"""Telemetry samples and the `SampleBus` they travel on (Persys Meter's input, never etcd).

A sample is what one workload instance or one node used at one moment: CPU (100 = one core),
memory bytes, disk/network throughput in bytes per second, and (nodes) disk space used in bytes.
The replica that receives an agent's report publishes them in batches; the meter's ingester consumes them as a consumer
group (`read`, then `ack` once stored), so a restarted ingester resumes where it stopped.
Samples are observability: publishing never fails the caller, losses are counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

WORKLOAD, NODE = "workload", "node"
METRICS: tuple[str, ...] = ("cpu", "memory", "disk_read", "disk_write", "net_rx", "net_tx", "disk_used")
# Metrics added after the first schema, in order: a store made before them gains their columns
# at open (meter.sql_store), and a row published without them (an older replica) reads as 0.
ADDED_METRICS: tuple[str, ...] = ("disk_used",)
MAX_LABELS = 8  # per sample: the labels the meter can be queried by (bounded cardinality)
MAX_LABEL_CHARS = 63
MAX_BATCH = 2_000  # samples per bus entry (one XADD)


@dataclass(frozen=True, slots=True)
class Sample:
    ts: float
    kind: str  # WORKLOAD or NODE
    node: str
    workload: str = ""  # "" for a node sample
    instance: str = ""
    runtime: str = ""
    labels: str = ""  # canonical "k=v,k2=v2", sorted (`label_text`)
    cpu: float = 0.0
    memory: float = 0.0
    disk_read: float = 0.0
    disk_write: float = 0.0
    net_rx: float = 0.0
    net_tx: float = 0.0
    disk_used: float = 0.0  # bytes used on the node's filesystems (node samples; 0 for workloads)

    def row(self) -> tuple[float | str, ...]:
        return (self.ts, self.kind, self.node, self.workload, self.instance, self.runtime, self.labels,
                self.cpu, self.memory, self.disk_read, self.disk_write, self.net_rx, self.net_tx, self.disk_used)


COLUMNS: tuple[str, ...] = ("ts", "kind", "node", "workload", "instance", "runtime", "labels", *METRICS)


def label_text(labels: Mapping[str, str]) -> str:
    """The bounded, canonical label string a sample carries: at most MAX_LABELS labels (by key
    order), each key and value short and free of the separators; the others are left out."""
    kept = [f"{k}={v}" for k, v in sorted(labels.items())
            if 0 < len(k) <= MAX_LABEL_CHARS and len(v) <= MAX_LABEL_CHARS
            and not any(c in k + v for c in ",=\n")]
    return ",".join(kept[:MAX_LABELS])


def encode(batch: Sequence[Sample]) -> bytes:
    return json.dumps([s.row() for s in batch], separators=(",", ":")).encode()


def decode(data: bytes | str) -> list[Sample]:
    """A batch as published; malformed rows are skipped (the bus is not trusted to be tidy)."""
    try:
        rows = json.loads(data)
    except ValueError:
        return []
    out: list[Sample] = []
    for r in rows if isinstance(rows, list) else []:
        try:
            out.append(Sample(float(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), str(r[5]), str(r[6]),
                              *(float(x) for x in r[7:7 + len(METRICS)])))
        except (TypeError, ValueError, IndexError):
            continue
    return out


@dataclass(frozen=True)
class Delivery:
    """One bus entry handed to a consumer: ack `id` once its samples are stored."""

    id: str
    samples: list[Sample]


@runtime_checkable
class SampleBus(Protocol):
    async def publish(self, batch: Sequence[Sample]) -> bool:
        """Append one batch as one entry; False if it was dropped (backend down). Never raises."""
        ...

    async def read(self, consumer: str, count: int = 50, block_ms: int = 1000) -> list[Delivery]:
        """Entries not yet delivered to the group (first this consumer's unacknowledged ones)."""
        ...

    async def ack(self, ids: Sequence[str]) -> None: ...

    async def backlog(self) -> int:
        """Entries published but not yet delivered to the group (-1: unknown)."""
        ...

    async def close(self) -> None: ...
