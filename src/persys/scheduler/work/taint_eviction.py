"""NoExecute taints evict (Kubernetes' taint-based eviction): an instance on a node carrying a
NoExecute taint it does not tolerate is moved off at once; one tolerating it with
`tolerationSeconds` is moved off that long after the taint was added (the smallest of its
matching tolerations' seconds); one tolerating it without seconds stays. Pure decisions here;
`EvictionTimers` wakes the workloads of a node when their time comes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from persys.model import Node
from persys.model.workload import workload_of
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.decide.taints import Eviction, eviction

__all__ = ["Eviction", "EvictionTimers", "dues", "eviction", "has_no_execute"]
MAX_TIMERS_PER_NODE = 64  # distinct future eviction times kept per node (the rest wait for the next change)


def has_no_execute(node: Node) -> bool:
    return any(t.effect == "NoExecute" for t in node.effective_taints())


def dues(state: Mirror, node_id: str) -> list[float]:
    """When each instance assigned to the node must leave it (those that may stay: none)."""
    cur = state.nodes.get(node_id)
    if cur is None:
        return []
    out = []
    for inst in state.assignments.get(node_id, {}):
        w = state.workloads.get(workload_of(inst))
        e = eviction(cur.value, w.value.spec.tolerations) if w is not None else None
        if e is not None:
            out.append(e.due)
    return out


class EvictionTimers:
    """Per node, a timer at each future eviction time of its instances: `wake(node_id)` is
    called then (the replica re-reconciles that node's workloads, which moves them off)."""

    def __init__(self, state: Mirror, wake: Callable[[str], None], clock: Callable[[], float]) -> None:
        self.state = state
        self.wake = wake
        self.clock = clock  # wall clock, as the taints' added_at
        self.handles: dict[str, list[asyncio.TimerHandle]] = {}

    def node_changed(self, node_id: str) -> None:
        """A node document changed: with a NoExecute taint on it, reconcile its workloads now
        (those due leave) and again at each later due time; without, forget its timers."""
        cur = self.state.nodes.get(node_id)
        if cur is None or not has_no_execute(cur.value):
            self.schedule(node_id, [])
            return
        self.wake(node_id)
        self.schedule(node_id, dues(self.state, node_id))

    def schedule(self, node_id: str, dues: Sequence[float]) -> None:
        for h in self.handles.pop(node_id, []):
            h.cancel()
        now = self.clock()
        future = sorted({d for d in dues if d > now})[:MAX_TIMERS_PER_NODE]
        if not future:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a mirror read outside the replica): nothing to time
            return
        # A little after the due time: the wall clock read at reconcile must have passed it.
        self.handles[node_id] = [loop.call_later(d - now + 0.05, self.wake, node_id) for d in future]

    def close(self) -> None:
        for hs in self.handles.values():
            for h in hs:
                h.cancel()
        self.handles.clear()
