"""The interpreter: carries out one step's `Effects`. Writes go to the planner in order (a
grouped step's together); what follows each (its events and usage once it lands, its
continuations, its fallback and requeue if it does not) is `decide.effects.follow`'s rule;
events are published, usage kept or dropped, delivery woken, workloads queued. The needs are
handed back for placement."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from persys.model import WorkloadUsage
from persys.scheduler.decide.effects import Effects, Event, Need, Write, follow
from persys.scheduler.interpret.planner import Planner


class Host(Protocol):
    """What the interpreter hands effects to (the replica's shell satisfies it)."""

    usage: dict[str, WorkloadUsage]

    def emit(self, kind: str, subject: str, message: str, reason: str = "", node: str = "") -> None: ...
    def enqueue(self, wid: str) -> None: ...


NodeCall = Callable[[str], None]


class Interpreter:
    def __init__(self, planner: Planner, host: Host, wake: NodeCall, resync: NodeCall) -> None:
        self.planner = planner
        self.host = host
        self.wake = wake  # deliver a node's desired state again
        self.resync = resync  # send a node its whole desired state

    async def run(self, fx: Effects) -> list[Need]:
        self.publish(fx.events)
        self.host.usage.update(fx.usage)
        for inst in fx.forget_usage:
            self.host.usage.pop(inst, None)
        if fx.grouped:
            oks = await self.planner.land(fx.writes, grouped=True)
            for w, ok in zip(fx.writes, oks, strict=True):
                await self.settle(w, ok)
        else:
            for w in fx.writes:
                await self.write(w)
        for node_id in fx.resync:
            self.resync(node_id)
        for node_id in fx.wake:
            self.wake(node_id)
        for wid in fx.enqueue:
            self.host.enqueue(wid)
        return fx.needs

    async def write(self, w: Write) -> bool:
        """Land one write and follow it; whether it landed."""
        ok = (await self.planner.land([w]))[0]
        await self.settle(w, ok)
        return ok

    async def settle(self, w: Write, landed: bool) -> None:
        out = follow(w, landed)
        for inst in out.forget_usage:
            self.host.usage.pop(inst, None)
        if out.requeue:
            self.host.enqueue(out.requeue)
        for nxt in out.next_writes:
            await self.write(nxt)
        self.publish(out.events)

    def publish(self, events: list[Event]) -> None:
        for e in events:
            self.host.emit(e.kind, e.subject, e.message, e.reason, node=e.node)

