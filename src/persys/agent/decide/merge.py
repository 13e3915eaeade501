"""What a desired-state message makes of the desired set the agent holds. Pure.

The scheduler's side of the protocol is `persys.scheduler.work.delivery.DeltaSender.step`: a stream
starts with a full set, sends one again on a mode change or a resync, and otherwise sends what
changed and what was removed (see AssignmentSet in control.proto). `merge` is the agent's side:

- Generation fencing: an instance already held at a newer generation keeps it (a message from a
  replica that lost its lease must not take it back).
- Hold mode (any mode but "normal"): updates are taken, nothing is removed, neither by absence
  from a full set nor by `removed`. Only a full set in normal mode makes the agent `synced`
  (allowed to remove what is not desired, persys.agent.decide.plan).
- A spec this agent cannot read (a workload the scheduler quarantines after a stricter model)
  is not desired, but listed as unreadable so that its running instance is kept as it is. A full
  set replaces the list; a delta updates it. Unreadable local records (`restore`) that the
  scheduler no longer lists are forgotten.

The agent applies the result: it replaces its desired set, writes `changed`, forgets `removed`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from persys.agent.decide.plan import Desired
from persys.model import DesiredState, WorkloadSpec

NORMAL = "normal"


@dataclass(frozen=True, slots=True)
class Item:
    """One assigned instance as the scheduler sends it (AssignedWorkload) or the agent recorded it."""

    instance_id: str
    revision: str
    generation: int
    desired_state: str
    spec_json: bytes | str
    fence_node: str = ""
    traceparent: str = ""
    devices: tuple[str, ...] = ()  # the node's devices (GPUs) the placement gave the instance


@dataclass(frozen=True, slots=True)
class Delta:
    """One desired-state message (AssignmentSet)."""

    items: tuple[Item, ...]
    mode: str = NORMAL
    full: bool = False
    removed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Held:
    """The desired set the agent holds: readable instances and the ones listed unreadable."""

    desired: Mapping[str, Desired]
    unreadable: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Merged:
    held: Held
    mode: str
    synced: bool  # a full set in normal mode: what is not desired may now be removed
    changed: dict[str, Desired]  # to write to the local records
    removed: frozenset[str]  # to forget (local records and trace contexts)
    traces: dict[str, str]  # instance -> the traceparent it came with (changed instances only)
    refused: dict[str, str] = field(default_factory=dict)  # newly unreadable instance -> why


def parse(item: Item) -> Desired | str:
    """The instance as the agent holds it, or why its spec cannot be read."""
    try:
        spec = WorkloadSpec.model_validate_json(item.spec_json)
    except ValueError as err:
        return str(err)
    return Desired(item.revision, item.generation, DesiredState(item.desired_state), spec, item.fence_node,
                   item.devices)


def merge(held: Held, delta: Delta) -> Merged:
    mode = delta.mode or NORMAL
    holding = mode != NORMAL
    changed: dict[str, Desired] = {}
    traces: dict[str, str] = {}
    unreadable: set[str] = set()
    refused: dict[str, str] = {}
    for item in delta.items:
        parsed = parse(item)
        if isinstance(parsed, str):
            if item.instance_id not in held.unreadable:
                refused[item.instance_id] = parsed
            unreadable.add(item.instance_id)
            continue
        old = held.desired.get(item.instance_id)
        if old is not None and old.generation > parsed.generation:
            continue  # fencing: never go back to an older generation
        changed[item.instance_id] = parsed
        traces[item.instance_id] = item.traceparent
    synced = delta.full and not holding
    if synced:
        listed = {item.instance_id for item in delta.items}
        removed = set(held.desired) - listed
        kept_unreadable = unreadable  # the scheduler's list replaces what we had
    else:
        removed = set() if holding else set(delta.removed) & set(held.desired)
        before = set(held.unreadable) if holding else set(held.unreadable) - set(delta.removed)
        kept_unreadable = (before - set(changed)) | unreadable
    removed |= set(held.unreadable) - kept_unreadable - set(changed)  # unreadable records no longer listed
    desired = {wid: d for wid, d in held.desired.items() if wid not in removed}
    desired.update(changed)
    return Merged(Held(desired, frozenset(kept_unreadable)), mode, synced, changed, frozenset(removed), traces,
                  refused)


def restore(records: Iterable[Item]) -> tuple[Held, dict[str, str]]:
    """The desired set an agent starts with, from its local records (no fence node, no trace),
    and the records it cannot read (an older agent's, a stricter model) -> why: their instances
    are kept as they run until the scheduler's list says otherwise."""
    desired: dict[str, Desired] = {}
    refused: dict[str, str] = {}
    for rec in records:
        parsed = parse(rec)
        if isinstance(parsed, str):
            refused[rec.instance_id] = parsed
        else:
            desired[rec.instance_id] = parsed
    return Held(desired, frozenset(refused)), refused
