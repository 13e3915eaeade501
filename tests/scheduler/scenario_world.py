"""A scheduler with no store, no event loop and no clock, driven by the pure step (raft's
scenario tests drive `RawNode` the same way).

The `World` holds a `Mirror`, a clock value and what agents told it. Commands change the world
as its clients, agents and time would; after each one it settles: every queued workload goes
through `step.on_changes`, its needs through the real placement engine and `on_placed`, and
every write through an in-memory planner that checks each guard against the mirror and folds
what lands back in (`mirror.fold`, the follower's own fold). The planner is the seam a script
uses to refuse a write (a lost race), so one of a grouped batch lands and the other does not.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from persys.model import Capabilities, Node, NodeStatus, Phase, Workload, WorkloadManifest, WorkloadStatus
from persys.model.node import RuntimeInfo
from persys.model.workload import workload_of
from persys.scheduler.decide import step
from persys.scheduler.decide.effects import Effects, Event, Intent, Write, follow
from persys.scheduler.decide.liveness import GuardConfig, GuardState, Heard
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.decide.placed import Placed, pending_write
from persys.scheduler.decide.report import Report, WorkloadReport
from persys.scheduler.interpret.ops import key_of, operation
from persys.scheduler.mirror import fold
from persys.scheduler.mirror.reports import LiveNode, runs_on
from persys.scheduler.placing.engine_adapter import PlacementService, to_request
from persys.store.base import Delete

GRACE = 10.0  # node grace (the scheduler's default)
SETTLE_PASSES = 50  # a script that never settles is a bug, not a hang


def intent_text(i: Intent) -> str:
    if i.doc is None:
        return f"delete {i.kind} {i.ident}"
    if isinstance(i.doc, WorkloadStatus):
        return f"put status {i.ident} {i.doc.phase}/{i.doc.reason}"
    if isinstance(i.doc, Node):
        return f"put node {i.ident} {i.doc.status}"
    return f"put {i.kind} {i.ident}"


@dataclass
class World:
    m: Mirror = field(default_factory=Mirror)
    now: float = 1000.0
    rev: int = 0
    queue: list[str] = field(default_factory=list)
    live: dict[str, LiveNode] = field(default_factory=dict)
    drift: dict[str, Any] = field(default_factory=dict)
    guard: GuardState = field(default_factory=GuardState)
    usage: dict[str, Any] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)  # intents landed since the last `expect writes`
    refused: list[str] = field(default_factory=list)  # writes the planner refused, likewise
    events: list[str] = field(default_factory=list)  # event kinds since the last `expect events`
    woken: set[str] = field(default_factory=set)  # nodes whose delivery was woken since the last `expect deliver`
    resynced: set[str] = field(default_factory=set)
    reject: list[str] = field(default_factory=list)  # intent kinds whose next write the planner refuses

    # --- the in-memory planner and the interpreter's rules ---

    def land(self, w: Write) -> bool:
        kinds = {i.kind for i in w.intents}
        for kind in list(self.reject):
            if kind in kinds:
                self.reject.remove(kind)
                self.refused.append("; ".join(intent_text(i) for i in w.intents))
                return False
        if any(self.m.rev_of(key_of(g.kind, g.ident)) != g.rev for g in w.guards):
            self.refused.append("; ".join(intent_text(i) for i in w.intents))
            return False
        self.rev += 1
        for i in w.intents:
            op = operation(i)
            if isinstance(op, Delete):
                change = fold.fold_delete(self.m, op.key, self.rev)
            else:
                change = fold.fold_put(self.m, op.key, op.value, self.rev, i.doc)
            self.changed(*change)
            self.written.append(intent_text(i))
        self.m.revision = self.rev
        return True

    def write(self, w: Write) -> bool:
        ok = self.land(w)
        out = follow(w, ok)
        for inst in out.forget_usage:
            self.usage.pop(inst, None)
        if out.requeue:
            self.enqueue(out.requeue)
        for nxt in out.next_writes:
            self.write(nxt)
        self.publish(out.events)
        return ok

    def run(self, fx: Effects) -> None:
        self.publish(fx.events)
        self.usage.update(fx.usage)
        for w in fx.writes:
            self.write(w)
        self.resynced.update(fx.resync)
        self.woken.update(fx.wake)
        for wid in fx.enqueue:
            self.enqueue(wid)

    def publish(self, events: list[Event]) -> None:
        self.events += [e.kind for e in events]

    def enqueue(self, wid: str) -> None:
        if wid not in self.queue:
            self.queue.append(wid)

    def changed(self, kind: str, ident: str) -> None:
        """The replica's mirror listener: what a change wakes."""
        if kind == "assignment":
            node_id, _, inst = ident.partition("/")
            self.woken.add(node_id)
            self.enqueue(workload_of(inst))
        elif kind in ("workload", "status"):
            self.enqueue(workload_of(ident))
        elif kind == "node":
            for inst in self.m.pending | set(self.m.assignments.get(ident, {})):
                self.enqueue(workload_of(inst))

    # --- settling: reconcile, place, commit, until nothing is queued ---

    def runs_on(self, inst: str, node_id: str) -> bool:
        return runs_on(self.m, self.live, True, inst, node_id)

    def settle(self) -> None:
        for _ in range(SETTLE_PASSES):
            if not self.queue:
                return
            wids, self.queue = self.queue, []
            fx = step.on_changes(self.m, wids, step.Context(self.now, self.runs_on))
            self.run(Effects(writes=fx.writes, events=fx.events))
            self.place(fx)
        raise AssertionError(f"the world did not settle in {SETTLE_PASSES} passes: {self.queue}")

    def place(self, fx: Effects) -> None:
        if not fx.needs:
            return
        service = PlacementService(self.m)  # a bare mirror: a fresh snapshot per pass
        requests = [to_request(n.workload, n.instance, None, self.m.volumes) for n in fx.needs]
        placed = []
        for need, decision in zip(fx.needs, service.place(requests), strict=True):
            if decision.node_id is not None:
                placed.append(Placed(need, decision))
                continue
            st = self.m.statuses.get(need.instance)
            pending = pending_write(need, st.value if st else None, decision, self.now)
            if pending is not None:
                self.write(pending)
        batch, broken = step.on_placed(self.m, placed, self.now)
        assert not broken, broken
        for p, w in zip(placed, batch.writes, strict=True):
            if not self.write(w):
                self.enqueue(p.need.workload.id)  # lost a race: looked at again


def workload(name: str, opts: dict[str, str]) -> Workload:
    spec: dict[str, Any] = {"type": "process", "process": {"command": ["sleep", "60"]},
                            "replicas": int(opts.get("replicas", 1)),
                            "resources": {"cpuMillicores": int(opts.get("cpu", 100)),
                                          "memoryMb": int(opts.get("memory", 64))}}
    m = WorkloadManifest.model_validate({"apiVersion": "persys.dev/v1", "kind": "Workload",
                                         "metadata": {"name": name}, "spec": spec})
    return Workload.from_manifest(m, 0.0)


def options(words: list[str]) -> dict[str, str]:
    return dict(w.split("=", 1) for w in words if "=" in w)


Command = Callable[[World, list[str]], None]
COMMANDS: dict[str, Command] = {}


def command(name: str) -> Callable[[Command], Command]:
    def register(fn: Command) -> Command:
        COMMANDS[name] = fn
        return fn
    return register


@command("apply")
def _apply(world: World, args: list[str]) -> None:
    """`apply web replicas=2 cpu=100 memory=64`: a client's create or update of the workload."""
    w = workload(args[0], options(args[1:]))
    cur = world.m.workloads.get(w.id)
    if cur is not None:
        w = cur.value.model_copy(update={"spec": w.spec, "revision": w.revision,
                                         "generation": cur.value.generation + 1})
    world.write(Write([], [Intent("workload", w.id, w)], fence=""))


@command("delete")
def _delete(world: World, args: list[str]) -> None:
    cur = world.m.workloads[args[0]]
    world.write(Write([], [Intent("workload", args[0], cur.value.model_copy(update={"deleting": True}))], fence=""))


@command("node")
def _node(world: World, args: list[str]) -> None:
    """`node n1 Ready cpu=4000 memory=8192` (registration and a heartbeat), `node n1 draining`."""
    node_id, what = args[0], args[1]
    cur = world.m.nodes.get(node_id)
    if what == "draining":
        assert cur is not None
        doc = cur.value.model_copy(update={"draining": True, "cordoned": True})
    else:
        o = options(args[2:])
        caps = Capabilities(runtimes={"process": RuntimeInfo()}, cpu_millicores=int(o.get("cpu", 4000)),
                            memory_mb=int(o.get("memory", 8192)), disk_mb=100_000)
        doc = Node(id=node_id, capabilities=caps, status=NodeStatus(what), status_reason="Registered")
        heartbeat(world, node_id)
    world.write(Write([], [Intent("node", node_id, doc)], fence="node"))


def heartbeat(world: World, node_id: str) -> None:
    live = world.live.setdefault(node_id, LiveNode(world.now, world.now))
    live.last_heartbeat = live.heard_at = live.last_heartbeat_wall = world.now


@command("heartbeat")
def _heartbeat(world: World, args: list[str]) -> None:
    for node_id in args:
        heartbeat(world, node_id)


@command("tick")
def _tick(world: World, args: list[str]) -> None:
    """`tick 11s`: the clock moves and the liveness step judges every node."""
    world.now += float(args[0].removesuffix("s"))
    seen = {n: Heard(live.last_heartbeat, live.heard_at) for n, live in world.live.items()}
    done = step.on_tick(step.Tick(dict(world.m.nodes), seen, world.now, 0.0, GRACE, world.guard, GuardConfig(),
                                  0.0, lambda n: world.live[n].heard_at if n in world.live else 0.0))
    world.guard = done.guard
    world.publish(done.effects.events)
    for t, w in zip(done.transitions, done.effects.writes, strict=True):
        if world.write(w) and not t.ready:
            for inst in world.m.assignments.get(t.node_id, {}):
                world.enqueue(workload_of(inst))


@command("report")
def _report(world: World, args: list[str]) -> None:
    """`report n1 web.0=Running web.1=Running [complete]`: an agent's report (a complete one lists
    everything the agent runs)."""
    node_id, complete = args[0], "complete" in args
    reports = []
    for word in args[1:]:
        if "=" not in word:
            continue
        inst, phase = word.split("=", 1)
        w = world.m.workloads[workload_of(inst)].value
        reports.append(WorkloadReport(inst, w.revision, w.generation, Phase(phase)))
    live = world.live.setdefault(node_id, LiveNode(world.now, world.now))
    listed = {r.workload_id for r in reports}
    gone = live.present - listed if complete else set()
    live.present = listed if complete else live.present | listed
    live.reported = live.reported or complete
    for inst in gone:
        world.enqueue(workload_of(inst))
    done = step.on_report(world.m, Report(node_id, reports, complete, gone, world.now), world.drift.get(node_id, {}))
    world.drift[node_id] = done.drift
    world.run(done.effects)


@command("reject")
def _reject(world: World, args: list[str]) -> None:
    """`reject next assignment`: the planner refuses the next write that sets or drops one (a
    concurrent writer won the race)."""
    world.reject.append(args[1])


def expect(world: World, words: list[str], line: str) -> None:
    what, rest = words[0], line.split(None, 2)[2] if len(words) > 1 else ""
    if what == "writes":
        got, world.written = world.written, []
        assert got == [w.strip() for w in rest.split(";") if w.strip()], got
    elif what == "refused":
        got, world.refused = world.refused, []
        assert got == [w.strip() for w in rest.split("|") if w.strip()], got
    elif what == "events":
        got, world.events = world.events, []
        assert got == words[1:], got
    elif what == "deliver":
        node_id, want = words[1], sorted(words[2:])
        assert node_id in world.woken, f"{node_id} not woken ({sorted(world.woken)})"
        world.woken.discard(node_id)
        assert sorted(world.m.assignments.get(node_id, {})) == want, sorted(world.m.assignments.get(node_id, {}))
    elif what == "resync":
        got, world.resynced = world.resynced, set()
        assert got == set(words[1:]), got
    elif what == "status":
        st = world.m.statuses[words[1]].value
        got = f"{st.phase}/{st.reason}" + (f" on {st.node_id}" if len(words) > 3 else "")
        assert got == " ".join(words[2:]), got
    else:
        raise AssertionError(f"unknown expectation {what!r}")


def play(script: list[str]) -> World:
    world = World()
    for line in script:
        words = shlex.split(line)
        try:
            if words[0] == "expect":
                expect(world, words[1:], line)
                continue
            COMMANDS[words[0]](world, words[1:])
            world.settle()
        except AssertionError as err:
            raise AssertionError(f"at `{line}`: {err}") from err
    return world
