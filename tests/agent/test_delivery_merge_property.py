"""The scheduler's delta sender (persys.scheduler.work.delivery.DeltaSender.step) against the agent's
merge (persys.agent.decide.merge), as a property: under any sequence of assignment changes,
spec updates (some unreadable to the agent), mode changes, resyncs, reconnects (a new stream, so
a new sender and a full set), failed writes of the local records (the link reopens the stream),
late messages of a deposed replica (older generations: fenced) and agent restarts (the agent
starts from its local records), once the stream has delivered, the
agent holds exactly what is assigned to its node: every assigned instance at its revision,
generation and state (or listed unreadable), nothing else in normal mode. And whenever no write
failed since the agent started, its local records restore to the set it holds.

Messages go through protobuf as on the wire (the conversion mirrors agent_control._watch) and
the agent's own `delta_of`. Pure: no stream, no store, no disk, no clock."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.agent import delta_of
from persys.agent.decide import merge
from persys.model import Assignment
from persys.model.workload import workload_of
from persys.scheduler.work.delivery import DeltaSender, DesiredSet

WORKLOADS = ["web", "db", "job"]
INSTANCES = [f"{w}.{i}" for w in WORKLOADS for i in range(3)]
BAD = b'{"type": "process", "command": 42, "unknownField": true}'
MODES = ["normal", "normal", "degraded"]  # mostly normal: the invariant is strongest there


def spec_json(workload: str, revision: str) -> bytes:
    if revision.startswith("bad"):  # quarantined: a spec the agent's model refuses
        return BAD
    return json.dumps({"type": "process", "process": {"command": ["sleep", workload, revision]}}).encode()


def wire(msg: DesiredSet) -> pb.AssignmentSet:
    """As agent_control._watch sends it."""
    return pb.AssignmentSet(
        workloads=[pb.AssignedWorkload(instance_id=i.workload_id, revision=i.revision, generation=i.generation,
                                       desired_state=i.desired_state, spec_json=i.spec_json,
                                       traceparent=i.trace_parent) for i in msg.items],
        mode=msg.mode, full=msg.full, removed=msg.removed)


@dataclass
class World:
    """The scheduler's assignments for one node, its stream, and the agent (memory and records)."""

    revisions: dict[str, str] = field(default_factory=lambda: dict.fromkeys(WORKLOADS, "r0"))
    assigned: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # instance -> rev, gen, state
    generation: int = 0
    mode: str = "normal"
    resync: bool = False
    sender: DeltaSender = field(default_factory=lambda: DeltaSender(deltas=True))
    held: merge.Held = field(default_factory=lambda: merge.Held({}))
    records: dict[str, merge.Item] = field(default_factory=dict)  # the agent's local records
    write_fails: bool = False  # the next write of the records fails
    dirty: bool = False  # a write failed since the agent started

    def next_generation(self) -> int:
        self.generation += 1
        return self.generation

    def assign(self, inst: str, state: str) -> None:
        self.assigned[inst] = (self.revisions[workload_of(inst)], self.next_generation(), state)

    def update(self, workload: str, readable: bool) -> None:
        """A new revision of a workload: the scheduler rewrites its instances' assignments."""
        self.revisions[workload] = f"{'r' if readable else 'bad'}{self.next_generation()}"
        for inst, (_, _, state) in list(self.assigned.items()):
            if workload_of(inst) == workload:
                self.assign(inst, state)

    def reconnect(self) -> None:
        self.sender = DeltaSender(deltas=True)

    def restart(self) -> None:
        self.held, _ = merge.restore(self.records.values())
        self.dirty = False
        self.reconnect()  # a new agent opens a new stream

    def deliver(self) -> None:
        assignments = [Assignment(instance_id=i, node_id="n1", revision=r, generation=g, desired_state=s)
                       for i, (r, g, s) in self.assigned.items()]

        def take_resync() -> bool:
            asked, self.resync = self.resync, False
            return asked

        msg = self.sender.step(assignments, self.mode, take_resync,
                               lambda wl: spec_json(wl, self.revisions[wl]))
        if msg is None:
            return
        m = merge.merge(self.held, delta_of(wire(msg)))
        self.held = m.held  # in memory whether or not the write lands (Agent.accept_desired)
        if self.write_fails:  # DesiredNotRecorded: the link reopens the stream for a full set
            self.write_fails, self.dirty = False, True
            self.reconnect()
            self.deliver()
            return
        for wid in m.removed:
            self.records.pop(wid, None)
        for wid, d in m.changed.items():
            self.records[wid] = merge.Item(wid, d.revision, d.generation, str(d.desired_state), d.spec.to_json())

    def stale(self, inst: str) -> None:
        """A late message from a replica that lost its lease: the instance at an older generation
        (and another spec). Generation fencing keeps what the agent holds."""
        held = self.held.desired.get(inst)
        if held is None or held.generation <= 1:
            return
        old = merge.Item(inst, "r-stale", held.generation - 1, "Stopped", spec_json(workload_of(inst), "r-stale"))
        m = merge.merge(self.held, merge.Delta((old,), self.mode))
        assert m.changed == {} and m.held.desired[inst] is held, f"{inst}: an older generation replaced a newer one"
        self.held = m.held

    def check(self) -> None:
        held = self.held
        for inst, (rev, gen, state) in self.assigned.items():
            if rev.startswith("bad"):
                assert inst in held.unreadable, f"{inst} (unreadable spec) not listed unreadable"
                continue
            d = held.desired.get(inst)
            assert d is not None, f"{inst} assigned, not desired on the agent"
            assert (d.revision, d.generation, str(d.desired_state)) == (rev, gen, state), inst
            assert d.spec.to_json() == merge.parse(merge.Item(inst, rev, gen, state, spec_json(
                workload_of(inst), rev))).spec.to_json()  # type: ignore[union-attr]
            assert inst not in held.unreadable, f"{inst} readable, listed unreadable"
        if self.mode == "normal":
            assigned = set(self.assigned)
            assert set(held.desired) <= assigned, f"desired, not assigned: {set(held.desired) - assigned}"
            assert held.unreadable <= assigned, f"unreadable, not assigned: {held.unreadable - assigned}"
        if not self.dirty:
            restored, _ = merge.restore(self.records.values())
            assert {k: (d.revision, d.generation, d.desired_state, d.spec) for k, d in restored.desired.items()} == \
                   {k: (d.revision, d.generation, d.desired_state, d.spec) for k, d in held.desired.items()}


instance = st.sampled_from(INSTANCES)
OPS = st.one_of(
    st.tuples(st.just("assign"), instance, st.sampled_from(["Running", "Running", "Stopped"])),
    st.tuples(st.just("unassign"), instance),
    st.tuples(st.just("update"), st.sampled_from(WORKLOADS), st.sampled_from([True, True, True, False])),
    st.tuples(st.just("mode"), st.sampled_from(MODES)),
    st.tuples(st.just("resync")),
    st.tuples(st.just("reconnect")),
    st.tuples(st.just("restart")),
    st.tuples(st.just("write_fails")),
    st.tuples(st.just("stale"), instance),
    st.tuples(st.just("deliver")),
    st.tuples(st.just("deliver")),
)


def run(world: World, ops: list[tuple[object, ...]]) -> None:  # noqa: C901 - a flat match, one case per op
    for op in ops:
        match op:
            case ("assign", str(inst), str(state)):
                world.assign(inst, state)
            case ("unassign", str(inst)):
                world.assigned.pop(inst, None)
            case ("update", str(wl), bool(readable)):
                world.update(wl, readable)
            case ("mode", str(mode)):
                world.mode = mode
            case ("resync",):
                world.resync = True
            case ("reconnect",):
                world.reconnect()
            case ("restart",):
                world.restart()
            case ("write_fails",):
                world.write_fails = True
            case ("stale", str(inst)):
                world.stale(inst)
            case ("deliver",):
                world.deliver()
                world.check()
            case _:
                raise AssertionError(f"unknown op {op}")
    world.deliver()
    world.check()


# Pure and fast (300 examples in ~2 s idle); no deadline: a loaded CI machine must not fail it on time.
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=40))
def test_agent_holds_what_is_assigned(ops: list[tuple[object, ...]]) -> None:
    run(World(), ops)


def test_a_restart_in_hold_mode_keeps_then_normal_mode_removes() -> None:
    """One sequence spelled out: what the property's `check` means in hold mode."""
    world = World()
    run(world, [("assign", "web.0", "Running"), ("assign", "db.0", "Running"), ("deliver",),
                ("mode", "degraded"), ("unassign", "db.0"), ("restart",), ("deliver",)])
    assert set(world.held.desired) == {"web.0", "db.0"}  # hold: a removal waits for normal mode
    run(world, [("mode", "normal")])
    assert set(world.held.desired) == {"web.0"} and set(world.records) == {"web.0"}
