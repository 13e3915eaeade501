"""A node's recent utilisation for load-aware scoring: the last heartbeats' cpu and memory, and
their 95th percentiles (pure; in memory, like every heartbeat fact)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 60  # heartbeats kept per node (minutes at the usual intervals)


@dataclass
class UsageWindow:
    cpu: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    memory: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def add(self, cpu_percent: float, memory_used_mb: int) -> None:
        self.cpu.append(cpu_percent)
        self.memory.append(memory_used_mb)

    def p95(self) -> tuple[float, int] | None:
        """(cpu %, memory MiB) at the 95th percentile of the window (None: nothing heard yet)."""
        if not self.cpu:
            return None
        cpu, memory = sorted(self.cpu), sorted(self.memory)
        return cpu[_at95(len(cpu))], memory[_at95(len(memory))]


def _at95(n: int) -> int:
    return min(n - 1, int(0.95 * n))
