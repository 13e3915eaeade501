"""The nodes' part in volumes: what their agents attach, and the steps on local volumes only the
node holding the data can take.

- Each report of an agent with storage lists every volume attached on its node; the replica that
  owns the node keeps one record per attachment (`/persys/attachments/<node>/<volume>`), written
  when one appears or changes and removed when it is gone, with `VolumeAttached` and
  `VolumeDetached` events. A local volume first seen attached with its size becomes Available.
- A local volume's delete, resize and snapshots are handed to its node in every heartbeat answer
  (level-triggered: until the record shows the step done, so a lost answer or result only delays
  it); the agent reports how each ended and the replica writes the outcome, as the volume
  controller does for network volumes (`volume_steps`).

Decisions are pure (`attachment_changes`, `result_action`, `provisioned_action`); the writes are
fenced by node ownership, so a replica that lost the node writes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from persys._pb.persys.v1 import control_pb2 as pb
from persys.model.names import NAME_RE
from persys.model.volume import (
    MAX_ATTACHMENT_USERS,
    MAX_SNAPSHOTS,
    MAX_VOLUME_MB,
    Volume,
    VolumeAttachment,
    VolumePhase,
)
from persys.scheduler.ha.mode_guard import Mode
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import Versioned, put_doc
from persys.scheduler.rules.volume_steps import NODE_STEPS, Action, Outcome, actions, done, failed
from persys.scheduler.work.shell import Shell
from persys.scheduler.work.volume_controller import write_outcome
from persys.store.base import Compare, Delete

log = logging.getLogger(__name__)
MAX_TASKS = 32  # volume tasks in one heartbeat answer (the rest follow in later ones)
MAX_ATTACHED = 1024  # attachments one report may list (a longer list is not taken as complete)
MAX_RESULTS = 64  # task results one report may carry
KINDS = ("filesystem", "vm-disk")


@dataclass(frozen=True, slots=True)
class Attached:
    """One volume attached on the reporting node, as its agent says."""

    volume_id: str
    driver: str
    kind: str
    read_only: bool
    instances: tuple[str, ...]
    size_mb: int = 0


@dataclass(frozen=True, slots=True)
class TaskResult:
    volume_id: str
    op: str
    snapshot: str
    ok: bool
    reason: str = ""
    size_mb: int = 0
    snapshots: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class VolumeReport:
    """The volume part of an agent's report: `listed` says `attached` is everything attached."""

    attached: tuple[Attached, ...]
    listed: bool
    results: tuple[TaskResult, ...]

    @classmethod
    def of(cls, r: pb.ReportStatusRequest) -> VolumeReport | None:
        """Parsed and bounded; None when the report carries no volume part (an agent without
        storage, or an older one)."""
        if not r.volumes_listed and not r.volume_results:
            return None
        attached = tuple(
            Attached(v.volume_id, v.driver, v.kind, v.read_only, tuple(v.instances[:MAX_ATTACHMENT_USERS]),
                     v.size_mb)
            for v in r.volumes[:MAX_ATTACHED])
        results = tuple(
            TaskResult(t.volume_id, t.op, t.snapshot, t.ok, t.reason[:1024], t.size_mb,
                       tuple(t.snapshots[:MAX_SNAPSHOTS]))
            for t in r.volume_results[:MAX_RESULTS])
        return cls(attached, r.volumes_listed and len(r.volumes) <= MAX_ATTACHED, results)


def attachment_changes(node_id: str, current: Mapping[str, VolumeAttachment], reported: Iterable[Attached],
                       volumes: Mapping[str, Versioned[Volume]], now: float
                       ) -> tuple[list[VolumeAttachment], list[str]]:
    """The records to write and the volume ids whose record goes (pure). Only volumes the cluster
    knows, with a known driver and kind, are recorded: a node cannot invent records."""
    puts: list[VolumeAttachment] = []
    seen: set[str] = set()
    for a in reported:
        cur = volumes.get(a.volume_id)
        if cur is None or a.kind not in KINDS or a.driver != cur.value.spec.driver or a.volume_id in seen:
            continue
        seen.add(a.volume_id)
        users = sorted({i for i in a.instances if len(i) <= 253})
        old = current.get(a.volume_id)
        if old is not None and (old.kind, old.read_only, old.instances) == (a.kind, a.read_only, users):
            continue
        puts.append(VolumeAttachment(volume=a.volume_id, node=node_id, driver=cur.value.spec.driver,
                                     kind=a.kind,  # type: ignore[arg-type]  # checked against KINDS above
                                     read_only=a.read_only, instances=users, since=old.since if old else now))
    return puts, sorted(vid for vid in current if vid not in seen)


def _mine(node_id: str, cur: Versioned[Volume] | None) -> Volume | None:
    if cur is None or cur.value.spec.driver != "local" or cur.value.node != node_id:
        return None
    return cur.value


def result_action(node_id: str, r: TaskResult, cur: Versioned[Volume] | None) -> tuple[Action, Outcome | None] | None:
    """The step a node's result finishes and what it writes (pure); None when the result no
    longer matches a step the record asks of that node (stale, repeated, or not its volume)."""
    v = _mine(node_id, cur)
    if v is None or cur is None or r.op not in NODE_STEPS:
        return None
    wanted = [a for a in actions({v.id: cur}, ("local",), {}, 0.0, node=node_id)
              if a.kind == r.op and a.snapshot == r.snapshot]
    if not wanted:
        return None
    a = wanted[0]
    if not r.ok:
        return a, failed(a, r.reason or "failed on the node (no reason given)")
    if r.op == "delete":
        return a, done(a, None, (), f" on node {node_id}")
    if not 1 <= r.size_mb <= MAX_VOLUME_MB or not all(NAME_RE.fullmatch(s) for s in r.snapshots):
        return a, failed(a, f"node {node_id} reported an unreadable outcome (size {r.size_mb} MiB)")
    return a, done(a, r.size_mb, r.snapshots, f" on node {node_id}")


def provisioned_action(node_id: str, a: Attached, cur: Versioned[Volume] | None) -> tuple[Action, Outcome] | None:
    """A local volume its node reports attached with a size, while its record still says it has
    none: the agent provisioned it at first attach; the record learns it (pure)."""
    v = _mine(node_id, cur)
    if v is None or cur is None or v.provisioned_mb or a.size_mb < 1 or a.size_mb > MAX_VOLUME_MB:
        return None
    if v.phase not in (VolumePhase.PENDING, VolumePhase.FAILED):
        return None
    step = Action("provision", v, cur.mod_revision)
    return step, done(step, a.size_mb, v.snapshots, f" at node {node_id}")


def task_messages(steps: Sequence[Action]) -> list[pb.VolumeTask]:
    return [pb.VolumeTask(volume_id=a.volume.id, driver=a.volume.spec.driver, op=a.kind,
                          size_mb=a.volume.spec.size_mb if a.kind == "resize" else 0, snapshot=a.snapshot)
            for a in steps[:MAX_TASKS]]


class NodeVolumes:
    def __init__(self, shell: Shell) -> None:
        self.s = shell
        self._local_on: dict[str, set[str]] = {}  # node -> its local volumes' ids
        self._node_of: dict[str, str] = {}  # local volume -> node
        self._indexed = False
        shell.state.subscribe(self._on_change)

    # -- the index of local volumes by node (kept by the mirror's changes) --

    def _on_change(self, kind: str, ident: str) -> None:
        if kind == "reset":
            self._indexed = False
        elif kind == "volume" and self._indexed:
            self._reindex(ident)

    def _reindex(self, vid: str) -> None:
        old = self._node_of.pop(vid, None)
        if old is not None:
            self._local_on.get(old, set()).discard(vid)
        cur = self.s.state.volumes.get(vid)
        if cur is not None and cur.value.spec.driver == "local" and cur.value.node:
            self._node_of[vid] = cur.value.node
            self._local_on.setdefault(cur.value.node, set()).add(vid)

    def _local_volumes(self, node_id: str) -> dict[str, Versioned[Volume]]:
        if not self._indexed:
            self._local_on.clear()
            self._node_of.clear()
            self._indexed = True
            for vid in list(self.s.state.volumes):
                self._reindex(vid)
        vols = self.s.state.volumes
        return {vid: vols[vid] for vid in self._local_on.get(node_id, ()) if vid in vols}

    # -- heartbeats: the work handed out --

    def tasks(self, node_id: str) -> list[pb.VolumeTask]:
        """The steps `node_id` should take on its local volumes now (none while frozen)."""
        if self.s.guard.mode != Mode.NORMAL:
            return []
        mine = self._local_volumes(node_id)
        return task_messages(actions(mine, ("local",), {}, 0.0, node=node_id)) if mine else []

    # -- reports: attachments and results --

    async def on_report(self, node_id: str, report: VolumeReport) -> None:
        state = self.s.state
        for r in report.results:
            found = result_action(node_id, r, state.volumes.get(r.volume_id))
            if found is not None:
                step, outcome = found
                if not r.ok:
                    log.warning("volume %s: %s failed on node %s: %s", r.volume_id, r.op, node_id, r.reason[:300])
                await write_outcome(self.s, step, outcome, fenced="node")
        for a in report.attached:
            learned = provisioned_action(node_id, a, state.volumes.get(a.volume_id))
            if learned is not None:
                await write_outcome(self.s, *learned, fenced="node")
        if report.listed:
            await self._record_attachments(node_id, report.attached)

    async def _record_attachments(self, node_id: str, reported: Sequence[Attached]) -> None:
        state = self.s.state
        current = {vid: a.value for vid, a in state.attachments.get(node_id, {}).items()}
        puts, gone = attachment_changes(node_id, current, reported, state.volumes, time.time())
        for att in puts:
            key = keys.attachment(node_id, att.volume)
            if await state.commit([Compare(key, state.rev_of(key))], [put_doc(key, att)], fenced="node"):
                if att.volume not in current:
                    users = ", ".join(att.instances[:5]) or "no instance"
                    self.s.emit("VolumeAttached", f"volume/{att.volume}",
                                f"on node {node_id} as {att.kind}{' (read-only)' if att.read_only else ''} "
                                f"for {users}", node=node_id)
        for vid in gone:
            key = keys.attachment(node_id, vid)
            if await state.commit([Compare(key, state.rev_of(key))], [Delete(key)], fenced="node"):
                self.s.emit("VolumeDetached", f"volume/{vid}", f"from node {node_id}", node=node_id)
