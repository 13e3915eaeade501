"""Clients' changes to workloads (apply, start/stop, restart, delete) and their dry runs (plan,
explain). Any replica may take them: each is a compare-and-swap on the workload's document,
retried a few times against concurrent writers. Reconciliation follows from the mirror."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from persys.model import DesiredState, Workload, WorkloadManifest
from persys.model.base import Model
from persys.model.revision import WorkloadRevision
from persys.model.workload import Metadata, instance_id
from persys.observability import trace_context, tracing
from persys.scheduler import placement as pl
from persys.scheduler.errors import MutationRefused, NotFound
from persys.scheduler.interpret.group_commit import TXN_MAX_BYTES, Unit, commit_units
from persys.scheduler.mirror import keys, quarantine
from persys.scheduler.mirror.follower import Versioned, put_doc
from persys.scheduler.placing.engine_adapter import to_request
from persys.scheduler.rules import revisions
from persys.scheduler.rules.volumes import check_workload_volumes, inline_records
from persys.scheduler.views.documents import replica_explanations
from persys.scheduler.work.shell import Shell
from persys.store.base import Compare, Delete, Put, TxnTooLarge, txn_bytes

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Model)
CAS_ATTEMPTS = 10


def updated_workload(old: Workload, incoming: Workload, now: float) -> Workload | None:
    """`old` changed to an applied manifest's spec and labels (None: nothing to change)."""
    same_spec = old.spec.spec_revision() == incoming.revision
    if same_spec and old.labels == incoming.labels and not old.deleting:
        return None
    if not same_spec and not old.deleting and old.spec.model_copy(update={"replicas": incoming.spec.replicas}) \
            == incoming.spec:
        # Only the replica count changed (a scale, e.g. by the automation): the running instances
        # keep their revision and generation, so none is restarted; the surplus is withdrawn and
        # new replicas start at the same revision (as `kubectl scale` keeps its ReplicaSet).
        return old.model_copy(update={"spec": incoming.spec, "labels": incoming.labels,
                                      "trace_parent": incoming.trace_parent, "updated_at": now})
    # A new spec starts a new count of restarts: its revision is its content hash alone, so the
    # same manifest has the same revision whatever restarts came before it.
    epoch = old.restart_epoch if same_spec else 0
    return old.model_copy(update={
        "spec": incoming.spec, "labels": incoming.labels, "restart_epoch": epoch,
        "trace_parent": incoming.trace_parent, "revision": Workload.revision_of(incoming.spec, epoch),
        "generation": old.generation + (0 if same_spec else 1), "updated_at": now, "deleting": False,
    })


class WorkloadApi:
    def __init__(self, shell: Shell, admit: Callable[[], Awaitable[None]]) -> None:
        self.s = shell
        self.admit = admit  # holds a bulk apply while the reconcile backlog is long

    async def apply(self, manifest: WorkloadManifest, dry_run: bool = False, rollback_of: int | None = None
                    ) -> tuple[Workload, bool, bool]:
        """Create or update a workload. Returns (workload, created, changed); idempotent. A new
        spec is also recorded in the workload's revision history (`rollback_of`: the generation
        whose spec this applies again)."""
        if not tracing.enabled():
            return await self._apply(manifest, dry_run, rollback_of)
        with tracing.span("scheduler.apply", {"persys.workload": manifest.metadata.name,
                                              "persys.dry_run": dry_run}) as s:
            w, created, changed = await self._apply(manifest, dry_run, rollback_of)
            s.set_attribute("persys.created", created)
            s.set_attribute("persys.changed", changed)
            s.set_attribute("persys.revision", w.revision)
            return w, created, changed

    async def _apply(self, manifest: WorkloadManifest, dry_run: bool, rollback_of: int | None
                     ) -> tuple[Workload, bool, bool]:
        if not dry_run:
            self.s.require_normal()
        state = self.s.state
        incoming = Workload.from_manifest(manifest, time.time())
        incoming.trace_parent = trace_context.current() or None  # this apply's span: placement joins it
        key = keys.workload(incoming.id)
        for _ in range(CAS_ATTEMPTS):
            check_workload_volumes(state, incoming.id, incoming.spec)
            vol_compares, vol_puts = inline_records(state, incoming, incoming.created_at)
            current = state.workloads.get(incoming.id)
            if current is None:
                if dry_run:
                    return incoming, True, True
                # rev_of: 0, or the revision of a stored document the model refuses, which a
                # valid manifest of the same name replaces.
                compares = [Compare(key, state.rev_of(key)), *vol_compares]
                if await self._commit(compares, self._recorded(compares, [Put(key, incoming.to_json()), *vol_puts],
                                                               incoming, True, rollback_of)):
                    self.s.emit("WorkloadCreated", f"workload/{incoming.id}", f"revision {incoming.revision}")
                    return incoming, True, True
                await self.s.refresh(key)
                continue
            updated = updated_workload(current.value, incoming, incoming.created_at)
            if updated is None:
                return current.value, False, False
            if dry_run:
                return updated, False, True
            compares = [Compare(key, current.mod_revision), *vol_compares]
            ops: list[Put | Delete] = [Put(key, updated.to_json()), *vol_puts]
            if updated.generation != current.value.generation:  # a new spec: a new revision record
                ops = self._recorded(compares, ops, updated, False, rollback_of)
            if await self._commit(compares, ops):
                self.s.emit("WorkloadUpdated", f"workload/{updated.id}", f"revision {updated.revision}")
                return updated, False, True
            await self.s.refresh(key)
        raise MutationRefused(f"workload {incoming.id} is being changed concurrently; try again")

    def _recorded(self, compares: list[Compare], ops: list[Put | Delete], w: Workload, fresh: bool,
                  rollback_of: int | None) -> list[Put | Delete]:
        """`ops` and, when they fit in the same write, `w`'s revision record and its pruning."""
        kept = self.s.state.revision_generations.get(w.id, set())
        record = revisions.record_ops(w, kept, w.updated_at, fresh, rollback_of)
        out = revisions.with_record(compares, ops, record, TXN_MAX_BYTES)
        if out is ops:
            log.warning("workload %s generation %d: its spec is too large to keep in the revision history too",
                        w.id, w.generation)
        return out

    async def revisions(self, wid: str) -> list[WorkloadRevision]:
        """The workload's kept revision records, oldest first (read from the store: the mirror
        holds only their keys)."""
        if wid not in self.s.state.workloads and wid not in self.s.state.refused:
            raise NotFound(f"workload {wid!r}")
        kvs, _ = await self.s.store.range(keys.revisions_of(wid))
        out = []
        for kv in kvs:
            try:
                out.append(WorkloadRevision.model_validate_json(kv.value))
            except ValueError as err:  # a hand-written or damaged record: the rest still show
                log.error("ignoring undecodable revision record %s: %s", kv.key, err)
        return out

    async def rollback_manifest(self, wid: str, generation: int = 0) -> tuple[WorkloadManifest, int]:
        """The manifest a rollback applies: the kept spec of `generation` (0: the one before the
        newest) under the workload's current name and labels; and that generation. The caller
        admits it (the workload policy may have changed since) and applies it with `rollback_of`."""
        cur = self.s.state.workloads.get(wid)
        if cur is None or cur.value.deleting:
            raise NotFound(f"workload {wid!r}")
        records = {r.generation: r for r in await self.revisions(wid)}
        target = revisions.rollback_target(wid, list(records), generation)
        manifest = WorkloadManifest(api_version="persys.dev/v1", kind="Workload",
                                    metadata=Metadata(name=wid, labels=dict(cur.value.labels)),
                                    spec=records[target].spec.model_copy(deep=True))
        return manifest, target

    async def _commit(self, compares: list[Compare], puts: list[Put | Delete]) -> bool:
        """One workload's compare-and-swap, in a span of its own when tracing."""
        if not tracing.enabled():
            return await self.s.state.commit(compares, puts, fenced=False)
        with tracing.span("store.commit", {"persys.store.ops": len(puts)}) as s:
            ok = await self.s.state.commit(compares, puts, fenced=False)
            s.set_attribute("persys.store.committed", ok)
            return ok

    async def apply_many(self, manifests: list[WorkloadManifest]) -> list[tuple[Workload, bool, bool]]:
        """Apply many manifests at once (same results as `apply` one by one, in order).

        New workloads are created together, many per transaction; a name applied twice in the
        batch, an existing workload, or a create that lost a race goes through `apply`."""
        self.s.require_normal()
        await self.admit()
        now = time.time()
        incoming = [Workload.from_manifest(m, now) for m in manifests]
        parent = trace_context.current() if tracing.enabled() else ""
        for w in incoming if parent else ():
            w.trace_parent = parent
        puts = [put_doc(keys.workload(w.id), w) for w in incoming]
        _check_sizes(puts, incoming)
        fresh = self._fresh(incoming)
        created: dict[int, bool] = {}
        if fresh:
            units = []
            for wid, i in fresh.items():
                compares = [Compare(keys.workload(wid), 0)]
                units.append(Unit(compares, self._recorded(compares, [puts[i]], incoming[i], True, None)))
            oks = await commit_units(lambda c, o: self.s.state.commit(c, o, fenced=False), units)
            for (wid, i), ok in zip(fresh.items(), oks, strict=True):
                created[i] = ok
                if ok:
                    self.s.emit("WorkloadCreated", f"workload/{wid}", f"revision {incoming[i].revision}")
        out = []
        for i, m in enumerate(manifests):
            out.append((incoming[i], True, True) if created.get(i) else await self.apply(m))
        return out

    def _fresh(self, incoming: list[Workload]) -> dict[str, int]:
        """The batch's new workloads, created together: workload id -> index of its only
        occurrence (named twice, existing, or with volumes: through `apply`)."""
        fresh: dict[str, int] = {}
        seen: set[str] = set()
        for i, w in enumerate(incoming):
            if w.id in seen:
                fresh.pop(w.id, None)
            elif w.id not in self.s.state.workloads and not w.spec.volumes:  # volumes: through apply
                fresh[w.id] = i
            seen.add(w.id)
        return fresh

    async def cas_change(self, key: str, what: str, read: Callable[[], Versioned[M] | None],
                         change: Callable[[M], M], stamp: Callable[[M], None] | None = None) -> tuple[M, bool]:
        """Apply an operator's change to one document with compare-and-swap (any replica may).

        Returns the document and whether it was written; `stamp` runs only on a real change."""
        self.s.require_normal()
        for _ in range(CAS_ATTEMPTS):
            cur = read()
            if cur is None:
                raise NotFound(what)
            updated = change(cur.value.model_copy(deep=True))
            if updated == cur.value:
                return updated, False
            if stamp is not None:
                stamp(updated)
            if await self.s.state.commit([Compare(key, cur.mod_revision)], [Put(key, updated.to_json())],
                                         fenced=False):
                return updated, True
            await self.s.refresh(key)
        raise MutationRefused(f"{what} is being changed concurrently; try again")

    async def _change_workload(self, wid: str, change: Callable[[Workload], Workload], event: str) -> Workload:
        def read() -> Versioned[Workload] | None:
            cur = self.s.state.workloads.get(wid)
            return cur if cur is not None and not cur.value.deleting else None

        def stamp(w: Workload) -> None:
            w.updated_at = time.time()

        updated, written = await self.cas_change(keys.workload(wid), f"workload {wid!r}", read, change, stamp)
        if written:
            self.s.emit(event, f"workload/{wid}", f"revision {updated.revision}")
        return updated

    async def set_desired_state(self, wid: str, state: DesiredState) -> Workload:
        """Start or stop a workload without editing its manifest."""

        def change(w: Workload) -> Workload:
            if w.spec.desired_state != state:
                w.spec.desired_state = state
                w.revision = Workload.revision_of(w.spec, w.restart_epoch)
                w.generation += 1
            return w

        return await self._change_workload(wid, change, "WorkloadStarted" if state == DesiredState.RUNNING
                                           else "WorkloadStopping")

    async def restart(self, wid: str) -> Workload:
        """Replace every instance with a fresh copy of the same spec (a new revision). Refused
        while no instance is placed: there is nothing to replace, and a new revision would only
        hide why the workload is pending."""
        cur = self.s.state.workloads.get(wid)
        if cur is not None and not cur.value.deleting and not any(
                instance_id(wid, i) in self.s.state.placement_of for i in range(cur.value.spec.replicas)):
            st = self.s.state.statuses.get(wid)
            why = f" ({st.value.phase}: {st.value.reason})" if st is not None and st.value.reason else ""
            raise MutationRefused(f"workload {wid!r} has no placed instance to restart{why}; it starts once it "
                                  f"can be placed (see `persysctl explain {wid}`)")

        def change(w: Workload) -> Workload:
            w.restart_epoch += 1
            w.revision = Workload.revision_of(w.spec, w.restart_epoch)
            w.generation += 1
            return w

        return await self._change_workload(wid, change, "WorkloadRestarting")

    async def delete(self, wid: str) -> tuple[bool, bool]:
        """Ask for a workload's removal. Returns (deleted, already_gone); idempotent."""
        self.s.require_normal()
        state = self.s.state
        key = keys.workload(wid)
        for _ in range(CAS_ATTEMPTS):
            current = state.workloads.get(wid)
            refused = state.refused.get(wid) if current is None else None
            if refused is not None:  # stored, but refused by the model: deletable all the same
                if refused.value.deleting:
                    return True, False
                marked, rev = quarantine.marked_deleting(refused.value, time.time()), refused.mod_revision
            elif current is None:
                return False, True
            elif current.value.deleting:
                return True, False
            else:
                doc = current.value.model_copy(update={"deleting": True, "updated_at": time.time()})
                marked, rev = doc.to_json(), current.mod_revision
            if await state.commit([Compare(key, rev)], [Put(key, marked)], fenced=False):
                self.s.emit("WorkloadDeleting", f"workload/{wid}", "deletion requested")
                return True, False
            await self.s.refresh(key)
        raise MutationRefused(f"workload {wid} is being changed concurrently; try again")

    def plan(self, manifest: WorkloadManifest) -> list[tuple[str, pl.Decision]]:
        """Where the workload's replicas would go now, and why. Writes and reserves nothing."""
        state = self.s.state
        w = Workload.from_manifest(manifest, time.time())
        current = state.workloads.get(w.id)
        requests = []
        for i in range(w.spec.replicas):
            inst = instance_id(w.id, i)
            st = state.statuses.get(inst)
            pinned = st.value.volume_node if st and st.value.volume_node and current else None
            requests.append(to_request(w, inst, pinned or None, state.volumes))
        decisions = self.s.placement.plan(requests)
        return [(r.id, d) for r, d in zip(requests, decisions, strict=True)]

    def explain(self, wid: str, node_id: str = "") -> dict[str, Any]:
        """The stored placement explanation of each replica; with `node_id`, every filter's
        verdict and the score breakdown for that node as the cluster stands now."""
        out = replica_explanations(self.s.state, wid)
        if node_id:
            if node_id not in self.s.state.nodes:
                raise NotFound(f"node {node_id!r}")
            ev = self.s.placement.evaluate(to_request(self.s.state.workloads[wid].value, wid,
                                                      volumes=self.s.state.volumes), node_id)
            out["node"] = ev.to_dict() if ev else None
        return out


def _check_sizes(puts: Sequence[Put], incoming: list[Workload]) -> None:
    """Refuse the batch before anything is written when one stored document would exceed a
    store write (records may be left out)."""
    for i, put in enumerate(puts):
        if txn_bytes([Compare(put.key, 0)], [put]) > TXN_MAX_BYTES:
            raise TxnTooLarge(f"manifest {i + 1} ({incoming[i].id}): its stored document of {len(put.value)} "
                              f"bytes exceeds the limit of {TXN_MAX_BYTES} bytes per store write")
