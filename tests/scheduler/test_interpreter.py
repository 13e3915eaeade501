"""The interpreter over the planner seam, with no store: a planner that refuses some writes
shows what follows each outcome (events and usage only once a write lands, its continuations
after it, its fallback and requeue when it does not), and a grouped plan lands in part."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from persys.model import Phase, WorkloadStatus, WorkloadUsage
from persys.scheduler.decide.effects import Effects, Event, Guard, Write, drop, put
from persys.scheduler.interpret.interpreter import Interpreter


@dataclass
class Refusing:
    """Lands every write except those dropping or setting a refused id; records what it saw."""

    refuse: set[str]
    seen: list[tuple[str, bool]] = field(default_factory=list)  # (first intent's id, grouped)

    async def land(self, writes: Sequence[Write], grouped: bool = False) -> list[bool]:
        self.seen += [(w.intents[0].ident, grouped) for w in writes]
        return [not any(i.ident in self.refuse for i in w.intents) for w in writes]


@dataclass
class Host:
    usage: dict[str, WorkloadUsage] = field(default_factory=dict)
    emitted: list[str] = field(default_factory=list)
    queued: list[str] = field(default_factory=list)

    def emit(self, kind: str, subject: str, message: str, reason: str = "", node: str = "") -> None:
        self.emitted.append(kind)

    def enqueue(self, wid: str) -> None:
        self.queued.append(wid)


def status(phase: Phase) -> WorkloadStatus:
    return WorkloadStatus(phase=phase)


async def test_what_follows_a_write_depends_on_whether_it_lands() -> None:
    planner, host, woken, resynced = Refusing({"n1/a"}), Host(), [], []
    host.usage["gone"] = WorkloadUsage(cpu_percent=1.0)
    fallback = Write([Guard("assignment", "n1/a", 3)], [put("status", "a-fallback", status(Phase.RUNNING))])
    refused = Write([Guard("workload", "a", 7)], [drop("assignment", "n1/a")], [Event("Relocating", "workload/a", "")],
                    otherwise=fallback, requeue="a")
    landed = Write([], [drop("workload", "gone")], [Event("WorkloadDeleted", "workload/gone", "")],
                   then=[Write([], [drop("revision", "gone/1")])], forget_usage=["gone"])
    fx = Effects(writes=[refused, landed], events=[Event("DriftDetected", "workload/x", "")], wake=["n1"],
                 resync=["n2"], enqueue=["x"])
    needs = await Interpreter(planner, host, woken.append, resynced.append).run(fx)
    assert needs == []
    assert planner.seen == [("n1/a", False), ("a-fallback", False), ("gone", False), ("gone/1", False)]
    assert host.emitted == ["DriftDetected", "WorkloadDeleted"]  # never the refused write's Relocating
    assert host.queued == ["a", "x"] and "gone" not in host.usage
    assert woken == ["n1"] and resynced == ["n2"]


async def test_a_grouped_plan_lands_in_part() -> None:
    planner, host = Refusing({"b"}), Host()
    writes = [Write([Guard("status", i, 1)], [put("status", i, status(Phase.RUNNING))],
                    [Event("WorkloadRunning", f"workload/{i}", "")], fence="node") for i in ("a", "b", "c")]
    await Interpreter(planner, host, print, print).run(Effects(writes=writes, grouped=True))
    assert planner.seen == [("a", True), ("b", True), ("c", True)]  # one call: may share transactions
    assert host.emitted == ["WorkloadRunning", "WorkloadRunning"]
