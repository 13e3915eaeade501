"""Desired-state delivery: what each node's agent is sent, and the delta protocol over its
WatchAssignments stream. One module owns both: the per-node wake-ups and resync requests, the
serialised specs (cached per revision), and the pure step (`DeltaSender.step`) that turns a
node's current assignments into the next message: a full set (the first, after a mode change,
on a resync, or to an agent that takes no deltas) or what changed and what was removed since
the last one. rpc/agent_control.py only converts the messages to protobuf."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from persys.model import Assignment
from persys.model.volume import Volume
from persys.model.workload import WorkloadSpec, workload_of
from persys.observability import tracing
from persys.scheduler.mirror.follower import ClusterState

SPEC_CACHE_ENTRIES = 16_384  # serialised specs kept for replicas and resends (see Delivery.spec_json)


@dataclass(frozen=True, slots=True)
class Item:
    workload_id: str  # an instance id
    revision: str
    generation: int
    desired_state: str
    spec_json: bytes
    trace_parent: str = ""  # the traceparent of the apply that wrote the spec ('' if untraced)


@dataclass(frozen=True, slots=True)
class DesiredSet:
    """One message of the stream."""

    items: list[Item]
    mode: str
    full: bool
    removed: list[str]


@dataclass
class DeltaSender:
    """What one stream has told its agent so far, and the next message (pure: no I/O)."""

    deltas: bool  # the agent takes deltas (newer agents); otherwise every message is a full set
    sent: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # id -> (revision, generation, state)
    last_mode: str = ""

    def step(self, assignments: Iterable[Assignment], mode: str, resync: Callable[[], bool],
             spec_of: Callable[[str], bytes | None], trace_of: Callable[[str], str] | None = None
             ) -> DesiredSet | None:
        """The message for the node's assignments now (None: nothing to send). `resync` is asked
        only when nothing else makes the message a full set (asking consumes a request).
        `trace_of(workload id)`: the trace context sent with an item (none without it)."""
        full = not self.deltas or mode != self.last_mode or resync()
        self.last_mode = mode
        current = {a.instance_id: a for a in assignments}
        removed = [] if full else [wid for wid in self.sent if wid not in current]
        for wid in removed:
            del self.sent[wid]
        if full:
            self.sent = {}
        items = []
        for wid, a in current.items():
            state = (a.revision, a.generation, str(a.desired_state))
            if not full and self.sent.get(wid) == state:
                continue
            spec = spec_of(workload_of(wid))
            if spec is None:
                continue  # its workload is gone from the mirror: withdrawn shortly
            self.sent[wid] = state
            wl = workload_of(wid)
            items.append(Item(wid, a.revision, a.generation, str(a.desired_state), spec,
                              trace_of(wl) if trace_of is not None else ""))
        if full or items or removed:
            return DesiredSet(items, mode, full, removed)
        return None


class Delivery:
    def __init__(self, state: ClusterState, require_owner: Callable[[str], None]) -> None:
        self.state = state
        self.require_owner = require_owner
        self.node_changed: dict[str, asyncio.Event] = {}
        self.resync: set[str] = set()  # nodes whose next message must be a full set
        self.spec_cache: dict[tuple[str, str], bytes] = {}

    def wake(self, node_id: str) -> None:
        ev = self.node_changed.get(node_id)
        if ev is not None:
            ev.set()

    def wake_all(self) -> None:
        """Every stream looks again (a mode change, a handoff: streams of nodes no longer owned end)."""
        for ev in self.node_changed.values():
            ev.set()

    def ask_resync(self, node_id: str) -> None:
        self.resync.add(node_id)
        self.wake(node_id)

    def take_resync(self, node_id: str) -> bool:
        """Whether the node's stream should send its full desired set next (asked once)."""
        if node_id in self.resync:
            self.resync.discard(node_id)
            return True
        return False

    def spec_json(self, wid: str) -> bytes | None:
        """A workload's spec as sent to agents, serialised once per revision for its replicas and
        for full resends (an agent reconnecting, a resync). Kept for recent revisions only:
        desired state goes out as deltas, so most specs are sent once, and a cache of every
        workload's spec would be tens of megabytes at 50,000 workloads."""
        cur = self.state.workloads.get(wid)
        if cur is None:
            refused = self.state.refused.get(wid)  # agents keep running what they already run
            return refused.value.spec_json() if refused is not None else None
        key = (wid, cur.value.revision)
        cached = self.spec_cache.get(key)
        if cached is None:
            if len(self.spec_cache) >= SPEC_CACHE_ENTRIES:
                self.spec_cache.clear()
            spec = cur.value.spec
            if any(v.claim is not None for v in spec.volumes):
                spec = resolved_claims(spec, {k: v.value for k, v in self.state.volumes.items()})
            cached = self.spec_cache[key] = spec.to_json()
        return cached

    def trace_parent(self, wid: str) -> str:
        """The trace context stored with a workload by its apply (sent to agents with its spec:
        it survives a scheduler restart and reaches whichever replica serves the node)."""
        cur = self.state.workloads.get(wid)
        return (cur.value.trace_parent or "") if cur is not None else ""

    async def desired_stream(self, node_id: str) -> AsyncIterator[list[Assignment]]:
        """Full desired state for `node_id`, again after every change to it."""
        ev = self.node_changed.setdefault(node_id, asyncio.Event())
        while True:
            self.require_owner(node_id)  # after a handoff the stream ends; the agent finds the new owner
            ev.clear()
            yield [a.value for a in self.state.assignments.get(node_id, {}).values()]
            await ev.wait()

    async def messages(self, node_id: str, deltas: bool, mode: Callable[[], str]) -> AsyncIterator[DesiredSet]:
        """The stream's messages: one whenever the node's desired state changed."""
        sender = DeltaSender(deltas)
        stream = self.desired_stream(node_id)
        async for assignments in stream:
            msg = sender.step(assignments, mode(), lambda: self.take_resync(node_id), self.spec_json,
                              self.trace_parent if tracing.enabled() else None)
            if msg is not None:
                yield msg


def resolved_claims(spec: WorkloadSpec, volumes: Mapping[str, Volume]) -> WorkloadSpec:
    """The spec as agents get it: a claimed Volume's driver and size written into its entry, so
    the node attaches it like an inline one (the user's spec leaves them to the Volume)."""
    resolved = []
    for v in spec.volumes:
        rec = volumes.get(v.claim) if v.claim is not None else None
        if rec is not None:
            update: dict[str, object] = {"driver": rec.spec.driver, "size_mb": rec.spec.size_mb}
            src = rec.spec.source
            if src is not None:
                # Whoever provisions first copies the source: a local clone is made by its node
                # at first attach (without this it formatted an empty filesystem), a network one
                # by the controller or the node, whichever comes first.
                update["source"] = f"snapshot:{src.snapshot}" if src.snapshot is not None else f"volume:{src.volume}"
            v = v.model_copy(update=update)
        resolved.append(v)
    return spec.model_copy(update={"volumes": resolved})

