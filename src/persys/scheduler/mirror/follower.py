"""The mirror's follower: the in-memory mirror of the durable state (`decide.mirror.Mirror`, the
data) kept current by a store watch (an informer); store events are folded in by the pure
`mirror.fold`.

Reads are served from memory; writes go to the store with compare-and-swap and are folded
into the mirror as soon as they commit, so the writer sees its own writes at once. The watch
later delivers the same revision again, which is ignored.

A watch that meets a compaction (its resume revision is no longer in the store's history: it
was cut off or too slow while the store compacted) cannot be resumed: the mirror reloads a
snapshot read at one revision, replaces its content with it in one step (keys gone since are
removed and their listeners told), and watches again from after that revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from persys.model import Assignment, Workload, WorkloadStatus
from persys.model.volume import Volume, VolumeAttachment
from persys.scheduler.decide.mirror import Change, Mirror, Versioned
from persys.scheduler.mirror import fold, keys
from persys.scheduler.mirror.health import LagTracker, MirrorHealth, MirrorSnapshot, judge
from persys.store.base import Compare, Delete, KeyValue, Put, StateStore, WatchCompacted, WatchEvent

log = logging.getLogger(__name__)
__all__ = ["ClusterState", "DocPut", "Listener", "Mirror", "Versioned", "put_doc"]


@dataclass(frozen=True)
class DocPut(Put):
    """A Put of a document's JSON that also carries the document: committing it folds the object
    into the mirror as is, instead of parsing back the bytes just written (the document must
    not be changed afterwards)."""

    doc: BaseModel | None = None


def put_doc(key: str, doc: Workload | WorkloadStatus | Assignment | Volume | VolumeAttachment) -> DocPut:
    return DocPut(key, doc.to_json(), doc=doc)


Listener = Callable[[str, str], None]  # (kind, id); kind in workload|status|node|assignment|volume|attachment


class ClusterState(Mirror):
    """The follower: the `Mirror`'s documents kept current from the store (load, watch, reload
    after a compaction) and written through fenced compare-and-swap commits."""

    def __init__(self, store: StateStore) -> None:
        super().__init__()
        self.store = store
        # Compares fenced writes must carry, by kind ("leader": reconciliation; "node": a node
        # owner's writes); None = this replica may not make such writes now.
        self.fences: dict[str, Callable[[], list[Compare] | None]] = {"leader": lambda: [], "node": lambda: []}
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
            fold.fold_put(self, kv.key, kv.value, kv.mod_revision)
        self.revision = rev
        self._wake_waiters()

    async def reset(self) -> None:
        """Forget everything and reload from the store (after a restore replaced it)."""
        await self.stop()
        # Read before forgetting: no await between clearing and refilling, so no task ever
        # sees an empty mirror.
        kvs, rev = await self.store.range(keys.ROOT)
        self.clear()
        for kv in kvs:
            fold.fold_put(self, kv.key, kv.value, kv.mod_revision)
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
        for kind, ident in fold.fold_snapshot(self, kvs, revision):
            self._notify(kind, ident)
        self._wake_waiters()

    def fold_read(self, kv: KeyValue) -> None:
        """Fold in a value read from the store directly (the winner of a lost compare-and-swap);
        the stale rule applies, so a newer value the watch already delivered stays."""
        self._changed(fold.fold_put(self, kv.key, kv.value, kv.mod_revision))

    def _apply_event(self, ev: WatchEvent) -> None:
        self._changed(fold.fold_event(self, ev))
        if self._revision_waiters:
            self._wake_waiters()

    def _changed(self, change: Change) -> None:
        if change[0]:
            self._notify(*change)

    def _notify(self, kind: str, ident: str) -> None:
        for listener in self._listeners:
            try:
                listener(kind, ident)
            except Exception:  # a listener bug must not stop the mirror
                log.exception("state listener failed")

    # --- writes ---

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
                self._changed(fold.fold_put(self, op.key, op.value, rev, op.doc if isinstance(op, DocPut) else None))
            else:
                self._changed(fold.fold_delete(self, op.key, rev))
        return True
