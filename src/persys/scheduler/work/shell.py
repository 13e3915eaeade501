"""What the replica's shell (replica/assembly.py) lends the components that do I/O for it: a narrow
protocol, so that they never import the shell (and the shell's helpers form no import cycle)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from persys.model import WorkloadUsage
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.ha.mode_guard import ModeGuard
from persys.scheduler.interpret.interpreter import Interpreter
from persys.scheduler.interpret.planner import StorePlanner
from persys.scheduler.mirror.follower import ClusterState
from persys.scheduler.mirror.reports import LiveNode
from persys.scheduler.placing.engine_adapter import PlacementService
from persys.scheduler.placing.queueing_hints import PendingHints
from persys.scheduler.work.delivery import Delivery
from persys.scheduler.work.metrics import ReplicaMetrics
from persys.scheduler.work.telemetry import Telemetry
from persys.store.base import StateStore


class Shell(Protocol):
    store: StateStore
    state: ClusterState
    config: SchedulerConfig
    clock: Callable[[], float]
    guard: ModeGuard
    placement: PlacementService
    live: dict[str, LiveNode]
    usage: dict[str, WorkloadUsage]
    metrics: ReplicaMetrics
    telemetry: Telemetry  # samples for Persys Meter (never blocks)
    hints: PendingHints  # the rejection codes node changes lifted since the monitor last looked
    delivery: Delivery  # desired-state delivery to agents (wake-ups, resyncs)

    def emit(self, kind: str, subject: str, message: str, reason: str = "", node: str = "") -> None:
        """Publish a cluster event (through the outbox: never blocks, never raises); `node`: the
        node it concerns, as the event's `fields.node` (what `events --node` matches)."""

    def enqueue(self, wid: str) -> None:
        """Have the reconcile worker look at a workload (de-duplicated)."""

    def enqueue_pending(self, hinted: frozenset[str] | None = None) -> None:
        """Look at every Pending instance's workload again (the cluster changed); with `hinted`
        (queueing_hints), only those a rejection code of which is in it."""

    def require_normal(self) -> None:
        """Raise Frozen unless the control plane accepts changes."""

    async def refresh(self, key: str) -> None:
        """After a lost compare-and-swap, fold the winner's write into the mirror."""


def interpreter_for(shell: Shell) -> Interpreter:
    """The replica's interpreter of the step's effects: the store planner over its mirror, its
    events, its delivery (each component that hands effects over holds one)."""
    return Interpreter(StorePlanner(shell.state, shell.metrics.batch_sizes), shell, shell.delivery.wake,
                       shell.delivery.ask_resync)
