"""What a step decides, as one value: the `Effects` the interpreter carries out.

A `Write` is intents (set or drop a document) under guards (each document at the revision the
decision read), one atomic unit, with what follows from whether it lands: events to publish
and usage to forget once it does, writes after it (`then`), a write instead (`otherwise`), a
workload to look at again (`requeue`). Intents name documents by kind and id, never by store
key: the key layout is the interpreter's (`scheduler.interpret.ops`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from persys.model import Assignment, Node, Workload, WorkloadStatus, WorkloadUsage
from persys.model.volume import Volume

Doc = Workload | WorkloadStatus | Assignment | Node | Volume
# Document kinds intents and guards name. The id of an assignment is "<node>/<instance>", of a
# revision record "<workload>/<generation>".
KINDS = ("workload", "status", "assignment", "node", "volume", "revision")
MAX_INTENTS = 128  # per write: the store's operations per transaction (etcd's --max-txn-ops)


@dataclass(frozen=True, slots=True)
class Guard:
    """The write lands only while this document is at `rev` (0: absent)."""

    kind: str
    ident: str
    rev: int


@dataclass(frozen=True, slots=True)
class Intent:
    """Set a document to `doc`, or drop it (`doc` None)."""

    kind: str
    ident: str
    doc: Doc | None = None

    @property
    def drops(self) -> bool:
        return self.doc is None


def put(kind: str, ident: str, doc: Doc) -> Intent:
    return Intent(kind, ident, doc)


def drop(kind: str, ident: str) -> Intent:
    return Intent(kind, ident)


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    subject: str
    message: str
    reason: str = ""
    node: str = ""  # the node it concerns (`events --node`)


@dataclass(slots=True)
class Write:
    """One guarded, atomic unit of intents, and what follows from whether it lands. `fence`:
    whose authority it is written under ("leader": reconciliation; "node": a node owner's
    write; "": any replica's, a client's own compare-and-swap)."""

    guards: list[Guard]
    intents: list[Intent]
    events: list[Event] = field(default_factory=list)  # published once it lands
    then: list[Write] = field(default_factory=list)  # written after it, if it lands
    otherwise: Write | None = None  # written instead, if it does not land
    requeue: str = ""  # a workload to look at again if it does not land
    forget_usage: list[str] = field(default_factory=list)  # instances whose usage goes once it lands
    fence: str = "leader"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What follows from one write landing or not (`follow`): the same rule for the interpreter
    and for a scenario that lands writes by hand."""

    events: list[Event]
    forget_usage: list[str]
    next_writes: list[Write]
    requeue: str


def follow(w: Write, landed: bool) -> Outcome:
    if landed:
        return Outcome(list(w.events), list(w.forget_usage), list(w.then), "")
    return Outcome([], [], [w.otherwise] if w.otherwise is not None else [], w.requeue)


@dataclass(slots=True)
class Need:
    """An instance that needs a node, decided on at the workload's revision `wrev`."""

    workload: Workload
    wrev: int
    instance: str


@dataclass(slots=True)
class Effects:
    """Everything one step decided. `writes` are written in order (a `grouped` step's may share
    transactions with other steps'); the rest needs no store."""

    writes: list[Write] = field(default_factory=list)
    needs: list[Need] = field(default_factory=list)  # instances to place
    events: list[Event] = field(default_factory=list)  # published now, whatever the writes do
    wake: list[str] = field(default_factory=list)  # nodes whose desired state to deliver again
    resync: list[str] = field(default_factory=list)  # nodes to send their whole desired state
    enqueue: list[str] = field(default_factory=list)  # workloads to look at again
    usage: dict[str, WorkloadUsage] = field(default_factory=dict)  # instance usage to keep
    forget_usage: list[str] = field(default_factory=list)  # instance usage to drop
    grouped: bool = False  # writes may share transactions with concurrent steps' (group commit)

    def merge(self, other: Effects) -> Effects:
        self.writes += other.writes
        self.needs += other.needs
        self.events += other.events
        self.wake += other.wake
        self.resync += other.resync
        self.enqueue += other.enqueue
        self.usage.update(other.usage)
        self.forget_usage += other.forget_usage
        return self


def chunks(intents: list[Intent], size: int = MAX_INTENTS) -> list[list[Intent]]:
    """`intents` in order, at most `size` to a write."""
    return [intents[i : i + size] for i in range(0, len(intents), size)]
