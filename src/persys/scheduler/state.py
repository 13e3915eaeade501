"""An in-memory mirror of the durable state, kept current by a store watch (an informer).

Reads are served from memory; writes go to the store with compare-and-swap and are folded
into the mirror as soon as they commit, so the writer sees its own writes at once. The watch
later delivers the same revision again, which is ignored. Tombstones stop an older put from
resurrecting a key that a newer delete removed.

A watch that meets a compaction (its resume revision is no longer in the store's history: it
was cut off or too slow while the store compacted) cannot be resumed: the mirror reloads a
snapshot read at one revision, replaces its content with it in one step (keys gone since are
removed and their listeners told), and watches again from after that revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from persys.model import Assignment, Node, Phase, Workload, WorkloadStatus
from persys.model.volume import Volume, VolumeAttachment
from persys.model.workload import workload_of
from persys.scheduler import keys
from persys.scheduler.mirror_health import LagTracker, MirrorHealth, MirrorSnapshot, judge
from persys.scheduler.quarantine import RefusedWorkload, parse_stored
from persys.scheduler.shards import decode_members
from persys.store.base import Compare, Delete, KeyValue, Put, StateStore, WatchCompacted, WatchEvent

log = logging.getLogger(__name__)
T = TypeVar("T", bound=BaseModel)


@dataclass(frozen=True)
class DocPut(Put):
    """A Put of a document's JSON that also carries the document: committing it folds the object
    into the mirror as is, instead of parsing back the bytes just written (the document must
    not be changed afterwards)."""

    doc: BaseModel | None = None


def put_doc(key: str, doc: Workload | WorkloadStatus | Assignment | Volume | VolumeAttachment) -> DocPut:
    return DocPut(key, doc.to_json(), doc=doc)


@dataclass(slots=True)
class Versioned(Generic[T]):
    value: T
    mod_revision: int


Listener = Callable[[str, str], None]  # (kind, id); kind in workload|status|node|assignment|volume|attachment


class ClusterState:
    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.workloads: dict[str, Versioned[Workload]] = {}
        # Stored workloads the model refuses: kept apart, never placed, never deleted unasked.
        self.refused: dict[str, Versioned[RefusedWorkload]] = {}
        self.statuses: dict[str, Versioned[WorkloadStatus]] = {}
        self.nodes: dict[str, Versioned[Node]] = {}
        self.volumes: dict[str, Versioned[Volume]] = {}
        self.assignments: dict[str, dict[str, Versioned[Assignment]]] = {}  # node -> workload -> a
        self.attachments: dict[str, dict[str, Versioned[VolumeAttachment]]] = {}  # node -> volume -> record
        self.attached_on: dict[str, set[str]] = {}  # volume -> nodes with an attachment record
        self.placement_of: dict[str, str] = {}  # instance -> node
        self.instances: dict[str, set[str]] = {}  # workload -> instances with a status or assignment
        self.pending: set[str] = set()  # instances whose status is Pending (retried as nodes change)
        # workload -> generations of its revision records (keys only: the specs stay in the store,
        # read when asked for; this is what pruning and deletion need to name the keys).
        self.revision_generations: dict[str, set[int]] = {}
        self.cluster_marker: dict[str, object] | None = None
        self.leader: bytes | None = None  # value of the leader key
        self.replicas: dict[str, str] = {}  # live replica -> address
        self.shards: tuple[tuple[str, ...], int] = ((), 0)  # (members, mod revision of the epoch key)
        # Compares fenced writes must carry, by kind ("leader": reconciliation; "node": a node
        # owner's writes); None = this replica may not make such writes now.
        self.fences: dict[str, Callable[[], list[Compare] | None]] = {"leader": lambda: [], "node": lambda: []}
        self.revision = 0
        self._tombstones: dict[str, int] = {}
        self._revs: dict[str, int] = {}
        self._listeners: list[Listener] = []
        self._watch_task: asyncio.Task[None] | None = None
        # Health of the watch (see mirror_health): how far behind, and how it recovers.
        self.lag = LagTracker()
        self.recovering = False  # reloading a snapshot after a compacted watch
        self.watch_error = ""  # the watch's last failure, cleared when it delivers again
        self.compaction_recoveries = 0
        self._revision_waiters: list[tuple[int, asyncio.Future[None]]] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        """Stop telling `listener` (a live watch that ended); unknown listeners are ignored."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def load(self) -> None:
        kvs, rev = await self.store.range(keys.ROOT)
        for kv in kvs:
            self._apply_put(kv.key, kv.value, kv.mod_revision, notify=False)
        self.revision = rev
        self._wake_waiters()

    async def reset(self) -> None:
        """Forget everything and reload from the store (after a restore replaced it)."""
        await self.stop()
        # Read before forgetting: no await between clearing and refilling, so no task ever
        # sees an empty mirror.
        kvs, rev = await self.store.range(keys.ROOT)
        self.workloads.clear()
        self.refused.clear()
        self.statuses.clear()
        self.nodes.clear()
        self.volumes.clear()
        self.assignments.clear()
        self.attachments.clear()
        self.attached_on.clear()
        self.placement_of.clear()
        self.instances.clear()
        self.pending.clear()
        self.revision_generations.clear()
        self.cluster_marker = None
        self.leader = None
        self.replicas.clear()
        self.shards = ((), 0)
        self._tombstones.clear()
        self._revs.clear()
        for kv in kvs:
            self._apply_put(kv.key, kv.value, kv.mod_revision, notify=False)
        self.revision = rev
        self._wake_waiters()
        self.start_following()
        self._notify("reset", "")

    # --- catching up ---

    async def wait_for_revision(self, revision: int) -> None:
        """Return once the mirror has applied every change up to `revision`."""
        if self.revision >= revision:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (revision, fut)
        self._revision_waiters.append(entry)
        try:
            await fut
        finally:
            with contextlib.suppress(ValueError):
                self._revision_waiters.remove(entry)

    def _wake_waiters(self) -> None:
        for rev, fut in self._revision_waiters:
            if rev <= self.revision and not fut.done():
                fut.set_result(None)

    def observe_store_revision(self, store_revision: int, now: float) -> None:
        """A probe read the store's current revision (for the lag in health)."""
        self.lag.observe(store_revision, self.revision, now)

    def health(self, now: float) -> MirrorHealth:
        return judge(MirrorSnapshot(self.revision, self.lag.store_revision, self.lag.behind_for(self.revision, now),
                                    self.recovering, self.watch_error))

    def start_following(self) -> None:
        self._watch_task = asyncio.create_task(self._follow(), name="state-watch")

    async def stop(self) -> None:
        if self._watch_task:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task

    async def _follow(self) -> None:
        while True:
            try:
                async for ev in self.store.watch(keys.ROOT, start_revision=self.revision + 1):
                    self._apply_event(ev)
                    if self.watch_error:
                        self.watch_error = ""
            except asyncio.CancelledError:
                raise
            except WatchCompacted as err:
                # Resuming is impossible: the changes in between are gone. Retrying the same
                # revision would fail forever and leave the mirror silently stale.
                log.warning("state watch: %s; reloading a snapshot of the store", err)
                self.recovering = True
                try:
                    await self._reload()
                except asyncio.CancelledError:
                    raise
                except Exception as reload_err:
                    self.watch_error = f"snapshot reload failed: {reload_err}"
                    log.warning("state mirror: %s; retrying", self.watch_error)
                    await asyncio.sleep(1.0)
                else:
                    self.recovering = False
                    self.watch_error = ""
                    self.compaction_recoveries += 1
                    log.warning("state mirror reloaded at revision %d after a compacted watch (recovery %d)",
                                self.revision, self.compaction_recoveries)
            except Exception as err:  # the store's watch resumes itself; this is a last resort
                self.watch_error = str(err) or type(err).__name__
                log.warning("state watch interrupted (%s); resuming from revision %d", err, self.revision)
                await asyncio.sleep(1.0)

    async def _reload(self) -> None:
        kvs, rev = await self.store.range(keys.ROOT)  # one revision: a consistent snapshot
        self.replace(kvs, rev)

    def replace(self, kvs: Sequence[KeyValue], revision: int) -> None:
        """Make the mirror what a snapshot read at `revision` holds, in one step (no await, and
        listeners are told only once everything is replaced, so none sees a half-updated mirror).
        Keys the snapshot lacks are deleted as of `revision`; changed keys are updated. Our own
        writes that landed after the snapshot are newer than it and stay (the stale rule)."""
        changed: list[tuple[str, str]] = []
        present = {kv.key for kv in kvs}
        for key in [k for k in self._revs if k not in present]:
            changed.append(self._apply_delete(key, revision, notify=False))
        for kv in kvs:
            if kv.mod_revision != self._revs.get(kv.key):
                changed.append(self._apply_put(kv.key, kv.value, kv.mod_revision, notify=False))
        self.revision = max(self.revision, revision)
        for kind, ident in changed:
            if kind:
                self._notify(kind, ident)
        self._wake_waiters()

    def fold_read(self, kv: KeyValue) -> None:
        """Fold in a value read from the store directly (the winner of a lost compare-and-swap);
        the stale rule applies, so a newer value the watch already delivered stays."""
        self._apply_put(kv.key, kv.value, kv.mod_revision)

    def _apply_event(self, ev: WatchEvent) -> None:
        if ev.type == "put":
            self._apply_put(ev.kv.key, ev.kv.value, ev.kv.mod_revision)
        else:
            self._apply_delete(ev.kv.key, ev.revision)
        self.revision = max(self.revision, ev.revision)
        if self._revision_waiters:
            self._wake_waiters()
        # Older events can no longer arrive: drop tombstones the watch has passed.
        if len(self._tombstones) > 1024:
            self._tombstones = {k: r for k, r in self._tombstones.items() if r > self.revision}

    # --- folding documents into the mirror ---

    def _stale(self, key: str, rev: int) -> bool:
        return rev <= self._revs.get(key, 0) or rev <= self._tombstones.get(key, 0)

    def _apply_put(self, key: str, value: bytes, rev: int, notify: bool = True, doc: BaseModel | None = None
                   ) -> tuple[str, str]:
        """Fold a put in unless it is stale; returns what changed (kind, id), ("", "") if nothing."""
        if self._stale(key, rev):
            return "", ""
        self._revs[key] = rev
        self._tombstones.pop(key, None)
        if key.startswith(keys.REVISIONS):  # indexed by key alone; nothing acts on it: no listener is told
            self._index_revision(key, True)
            return "", ""
        kind, ident = self._fold(key, value, rev, doc)
        if notify and kind:
            self._notify(kind, ident)
        return kind, ident

    def _apply_delete(self, key: str, rev: int, notify: bool = True) -> tuple[str, str]:
        if self._stale(key, rev):
            return "", ""
        self._revs.pop(key, None)
        self._tombstones[key] = rev
        if key.startswith(keys.REVISIONS):
            self._index_revision(key, False)
            return "", ""
        kind, ident = self._unfold(key)
        if notify and kind:
            self._notify(kind, ident)
        return kind, ident

    def _fold(self, key: str, value: bytes, rev: int, doc: BaseModel | None = None) -> tuple[str, str]:
        try:
            if key.startswith(keys.WORKLOADS):
                return self._fold_workload(key.removeprefix(keys.WORKLOADS), value, rev, doc)
            if key.startswith(keys.STATUS):
                wid = key.removeprefix(keys.STATUS)
                st = doc if isinstance(doc, WorkloadStatus) else WorkloadStatus.model_validate_json(value)
                self.statuses[wid] = Versioned(st, rev)
                if st.phase == Phase.PENDING:
                    self.pending.add(wid)
                else:
                    self.pending.discard(wid)
                self.instances.setdefault(workload_of(wid), set()).add(wid)
                return "status", wid
            if key.startswith(keys.NODES):
                n = Node.model_validate_json(value)
                self.nodes[n.id] = Versioned(n, rev)
                return "node", n.id
            if key.startswith((keys.VOLUMES, keys.ATTACHMENTS)):
                return self._fold_storage(key, value, rev, doc)
            if key.startswith(keys.ASSIGNMENTS):
                a = doc if isinstance(doc, Assignment) else Assignment.model_validate_json(value)
                self.assignments.setdefault(a.node_id, {})[a.instance_id] = Versioned(a, rev)
                self.placement_of[a.instance_id] = a.node_id
                self.instances.setdefault(workload_of(a.instance_id), set()).add(a.instance_id)
                return "assignment", f"{a.node_id}/{a.instance_id}"
            if key == keys.CLUSTER:
                self.cluster_marker = json.loads(value)
                return "cluster", ""
            if key == keys.LEADER:
                self.leader = value
                return "leader", ""
            if key.startswith(keys.REPLICAS):
                self.replicas[key.removeprefix(keys.REPLICAS)] = str(json.loads(value).get("address", ""))
                return "replicas", ""
            if key == keys.SHARDS:
                self.shards = (decode_members(value), rev)
                return "shards", ""
        except (ValueError, TypeError, AttributeError) as err:
            # Valid JSON of the wrong shape (a list where an object belongs) too: one bad value
            # must not stop the mirror, which would otherwise be handed the same event forever.
            log.error("ignoring undecodable document at %s: %s: %s", key, type(err).__name__, err)
        return "", ""

    def _fold_storage(self, key: str, value: bytes, rev: int, doc: BaseModel | None) -> tuple[str, str]:
        if key.startswith(keys.VOLUMES):
            v = doc if isinstance(doc, Volume) else Volume.model_validate_json(value)
            self.volumes[v.id] = Versioned(v, rev)
            return "volume", v.id
        att = doc if isinstance(doc, VolumeAttachment) else VolumeAttachment.model_validate_json(value)
        node_id, vid = keys.parse_attachment(key)
        self.attachments.setdefault(node_id, {})[vid] = Versioned(att, rev)
        self.attached_on.setdefault(vid, set()).add(node_id)
        return "attachment", f"{node_id}/{vid}"

    def _fold_workload(self, wid: str, value: bytes, rev: int, doc: BaseModel | None) -> tuple[str, str]:
        w = doc if isinstance(doc, Workload) else parse_stored(wid, value)
        if isinstance(w, RefusedWorkload):
            log.error("stored workload %s refused by the model (kept, not placed): %s", wid, "; ".join(w.problems))
            self.workloads.pop(wid, None)
            self.refused[wid] = Versioned(w, rev)
            return "workload", wid
        self.refused.pop(w.id, None)
        self.workloads[w.id] = Versioned(w, rev)
        return "workload", w.id

    def _unfold(self, key: str) -> tuple[str, str]:
        if key.startswith(keys.WORKLOADS):
            wid = key.removeprefix(keys.WORKLOADS)
            self.workloads.pop(wid, None)
            self.refused.pop(wid, None)
            return "workload", wid
        if key.startswith(keys.STATUS):
            wid = key.removeprefix(keys.STATUS)
            self.statuses.pop(wid, None)
            self.pending.discard(wid)
            self._unindex(wid)
            return "status", wid
        if key.startswith(keys.NODES):
            nid = key.removeprefix(keys.NODES)
            self.nodes.pop(nid, None)
            return "node", nid
        if key.startswith((keys.VOLUMES, keys.ATTACHMENTS)):
            return self._unfold_storage(key)
        if key.startswith(keys.ASSIGNMENTS):
            nid, wid = keys.parse_assignment(key)
            per_node = self.assignments.get(nid, {})
            per_node.pop(wid, None)
            if not per_node:
                self.assignments.pop(nid, None)
            if self.placement_of.get(wid) == nid:
                del self.placement_of[wid]
            self._unindex(wid)
            return "assignment", f"{nid}/{wid}"
        if key in (keys.CLUSTER, keys.LEADER):
            if key == keys.CLUSTER:
                self.cluster_marker = None
                return "cluster", ""
            self.leader = None
            return "leader", ""
        if key.startswith(keys.REPLICAS):
            self.replicas.pop(key.removeprefix(keys.REPLICAS), None)
            return "replicas", ""
        if key == keys.SHARDS:
            self.shards = ((), 0)
            return "shards", ""
        return "", ""

    def _unfold_storage(self, key: str) -> tuple[str, str]:
        if key.startswith(keys.VOLUMES):
            vid = key.removeprefix(keys.VOLUMES)
            self.volumes.pop(vid, None)
            return "volume", vid
        node_id, vid = keys.parse_attachment(key)
        on_node = self.attachments.get(node_id, {})
        on_node.pop(vid, None)
        if not on_node:
            self.attachments.pop(node_id, None)
        nodes = self.attached_on.get(vid, set())
        nodes.discard(node_id)
        if not nodes:
            self.attached_on.pop(vid, None)
        return "attachment", f"{node_id}/{vid}"

    def _index_revision(self, key: str, present: bool) -> None:
        parsed = keys.parse_revision(key)
        if parsed is None:
            return
        wid, generation = parsed
        if present:
            self.revision_generations.setdefault(wid, set()).add(generation)
            return
        known = self.revision_generations.get(wid)
        if known is not None:
            known.discard(generation)
            if not known:
                del self.revision_generations[wid]

    def _unindex(self, instance: str) -> None:
        if instance in self.statuses or instance in self.placement_of:
            return
        wid = workload_of(instance)
        known = self.instances.get(wid)
        if known is not None:
            known.discard(instance)
            if not known:
                del self.instances[wid]

    def _notify(self, kind: str, ident: str) -> None:
        for listener in self._listeners:
            try:
                listener(kind, ident)
            except Exception:  # a listener bug must not stop the mirror
                log.exception("state listener failed")

    # --- writes ---

    def rev_of(self, key: str) -> int:
        """The mod revision the mirror holds for `key` (0 = absent), for compare-and-swap."""
        return self._revs.get(key, 0)

    async def commit(self, compares: Sequence[Compare], ops: Sequence[Put | Delete], fenced: bool | str = True
                     ) -> bool:
        """Apply `ops` atomically if every compare holds; fold them into the mirror on success.

        Fenced writes (the default: everything reconciliation does) also require this replica to
        still hold the leadership it had when it decided; unfenced ones (a client's own CAS on a
        workload) may come from any replica."""
        if fenced:
            fence = self.fences["leader" if fenced is True else str(fenced)]()
            if fence is None:
                return False
            compares = [*fence, *compares]
        rev = await self.store.txn(compares, ops)
        if rev is None:
            return False
        for op in ops:
            if isinstance(op, Put):
                self._apply_put(op.key, op.value, rev, doc=op.doc if isinstance(op, DocPut) else None)
            else:
                self._apply_delete(op.key, rev)
        return True
