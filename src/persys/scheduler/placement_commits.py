"""The placement pipeline: decide nodes for a batch of needs in one engine pass (reserving as
it goes), then commit the decisions concurrently, many to a transaction. The documents a
decision becomes are built by pure functions; `Placer` does the I/O for the replica's shell."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from persys.model import Assignment, Phase, Workload, WorkloadStatus
from persys.model.volume import Volume
from persys.model.workload import instance_id
from persys.observability import tracing
from persys.scheduler import failures, keys, placement_tracing
from persys.scheduler import placement as pl
from persys.scheduler.group_commit import FENCE_HEADROOM, TXN_MAX_OPS, Unit, commit_units
from persys.scheduler.placement_service import has_local_volumes, to_request
from persys.scheduler.preemption_commits import try_preempt
from persys.scheduler.reconcile import Need
from persys.scheduler.shell import Shell
from persys.scheduler.state import Versioned, put_doc
from persys.scheduler.views import placement_doc
from persys.scheduler.volume_rules import volume_ids
from persys.store.base import Compare, Put, StoreUnavailable

log = logging.getLogger(__name__)
PLACE_CHUNK = 128  # placements decided between two yields to the event loop
PREEMPTIONS_PER_PASS = 4  # preemption attempts per engine pass (each ~0.1 s at 5,000 nodes)
# Each placement carries two compares and two puts; with the leader fence that stays within
# etcd's default --max-txn-ops of 128 per branch.
PLACEMENTS_PER_TXN = (TXN_MAX_OPS - FENCE_HEADROOM) // 2


@dataclass(slots=True)
class Placed:
    """A decision on its way to the store."""

    need: Need
    decision: pl.Decision
    explanation: str = ""
    moved_from: str = ""
    decided_ns: int = 0  # when the engine pass began (wall clock, ns), kept only when tracing

    @property
    def instance(self) -> str:
        return self.need.instance


def placement_unit(p: Placed, prev: WorkloadStatus | None, now: float,
                   homes: Sequence[Versioned[Volume]] = (), note: str = "",
                   seen: dict[str, Any] | None = None) -> Unit:
    """The compares and puts that make one decision durable: its assignment (created only if
    absent, only while the workload is at the revision decided on) and its status; `homes`:
    local volume records without a node yet, which now live where the instance goes. Records on
    `p` where the instance moved from and the explanation, for the events once it lands."""
    node_id = p.decision.node_id
    assert node_id is not None
    w, inst = p.need.workload, p.instance
    assignment = Assignment(
        workload_id=inst, node_id=node_id, revision=w.revision, generation=w.generation,
        desired_state=w.spec.desired_state, cpu_millicores=w.spec.resources.cpu_millicores,
        memory_mb=w.spec.resources.memory_mb, disk_mb=w.spec.resources.disk_mb,
        devices=list(p.decision.devices) or None, created_at=now,
    )
    volume_node = (prev.volume_node if prev else "") or (node_id if has_local_volumes(w) else "")
    p.moved_from = prev.relocating_from if prev else ""
    p.explanation = p.decision.explain() + note  # note: e.g. whom it preempted
    status = WorkloadStatus(
        phase=Phase.SCHEDULED, node_id=node_id, reason="Scheduled", message=p.explanation,
        placement=placement_doc(p.decision, p.explanation, seen), volume_node=volume_node,
        relocating_from=p.moved_from, updated_at=now,
    )
    akey = keys.assignment(node_id, inst)
    compares = [Compare(keys.workload(w.id), p.need.wrev), Compare(akey, 0)]
    puts = [put_doc(akey, assignment), put_doc(keys.status(inst), status)]
    for h in homes:
        compares.append(Compare(keys.volume(h.value.id), h.mod_revision))
        puts.append(put_doc(keys.volume(h.value.id), h.value.model_copy(update={"node": node_id, "updated_at": now})))
    return Unit(compares, puts)


def unhomed_local_volumes(w: Workload, volumes: Mapping[str, Versioned[Volume]]) -> list[Versioned[Volume]]:
    """The workload's local volume records that no node holds yet (pure)."""
    out = []
    for vid in volume_ids(w.id, w.spec):
        rec = volumes.get(vid)
        if rec is not None and rec.value.spec.driver == "local" and not rec.value.node:
            out.append(rec)
    return out


def pending_status(prev: WorkloadStatus | None, decision: pl.Decision, now: float,
                   seen: dict[str, Any] | None = None) -> WorkloadStatus | None:
    """The status of an instance no node fits (None: it says so already)."""
    reason = decision.explain_detailed()
    if prev is not None and prev.phase == Phase.PENDING and prev.message == reason:
        return None
    # An instance moved off a node (drain, loss) that fits nowhere is still being moved: keeping
    # where it came from keeps it in the drain's progress (it used to vanish from it, and the
    # drain said done while it sat Pending).
    return WorkloadStatus(phase=Phase.PENDING, reason="Unschedulable", message=reason,
                          placement=placement_doc(decision, reason, seen),
                          volume_node=prev.volume_node if prev else "",
                          relocating_from=prev.relocating_from if prev else "", updated_at=now)


class Placer:
    def __init__(self, shell: Shell) -> None:
        self.s = shell
        self.inflight: set[str] = set()  # instances whose placement is being committed
        self.slots = asyncio.Semaphore(shell.config.commit_concurrency)
        self.tasks: set[asyncio.Task[None]] = set()

    async def place_isolated(self, needs: list[Need]) -> None:
        """`place` the batch; if it raises, place its workloads one by one so that only the one
        that fails is marked (with the reason) and every other is placed."""
        try:
            await self.place(needs)
            return
        except StoreUnavailable as err:
            await self.requeue_unplaced(needs, err)
            return
        except Exception as err:
            if len({n.workload.id for n in needs}) == 1:
                self.undo(needs)
                log.warning("placing %s failed: %s", needs[0].workload.id, failures.describe(err))
                await self.mark_failed(needs[0].workload.id, [n.instance for n in needs], failures.PLACEMENT_ERROR,
                                       err)
                return
            log.warning("placing a batch of %d failed (%s); placing them one workload at a time", len(needs),
                        failures.describe(err))
        self.undo(needs)
        by_workload: dict[str, list[Need]] = {}
        for item in needs:
            by_workload.setdefault(item.workload.id, []).append(item)
        for wid, items in by_workload.items():
            try:
                await self.place(items)
            except StoreUnavailable as err:
                await self.requeue_unplaced(items, err)
            except Exception as err:
                self.undo(items)
                log.warning("placing %s failed: %s", wid, failures.describe(err))
                await self.mark_failed(wid, [n.instance for n in items], failures.PLACEMENT_ERROR, err)

    async def requeue_unplaced(self, needs: list[Need], err: StoreUnavailable) -> None:
        """The store failed, not the placement: nothing is wrong with these workloads. Release
        what was reserved for them and look at them again once the store answers."""
        self.undo(needs)
        wids = list(dict.fromkeys(n.workload.id for n in needs))
        log.warning("store unavailable while placing %d workload(s): %s; retrying", len(wids), err)
        await asyncio.sleep(1.0)
        for wid in wids:
            self.s.enqueue(wid)

    def undo(self, needs: list[Need]) -> None:
        """Release what a failed `place` reserved for instances it did not hand to a commit."""
        for n in needs:
            if n.instance not in self.inflight:
                self.s.placement.release(n.instance)

    async def mark_failed(self, wid: str, instances: list[str] | None, reason: str, err: BaseException) -> None:
        """Say on the workload's unplaced instances (all of them when None) why they have no
        node, and publish it; never raises (the worker must go on)."""
        message = failures.describe(err)
        self.s.emit("WorkloadFailed" if reason == failures.INTERNAL_ERROR else "PlacementFailed",
                    f"workload/{wid}", message, reason)
        state = self.s.state
        try:
            cur = state.workloads.get(wid)
            if cur is None:
                return
            if instances is None:
                instances = [instance_id(wid, i) for i in range(cur.value.spec.replicas)]
            now = time.time()
            for inst in failures.unplaced(instances, state.placement_of):
                st = state.statuses.get(inst)
                new = failures.failure_status(st.value if st else None, reason, message, now)
                if new is not None:
                    await state.commit([Compare(keys.workload(wid), cur.mod_revision)],
                                       [Put(keys.status(inst), new.to_json())])
        except Exception:
            log.exception("could not record the failure of %s", wid)

    async def place(self, needs: list[Need]) -> None:
        state = self.s.state
        requests = []
        for n in needs:
            st = state.statuses.get(n.instance)
            pinned = st.value.volume_node if st and st.value.volume_node else None
            requests.append(to_request(n.workload, n.instance, pinned, state.volumes))
        decisions: list[pl.Decision] = []
        started_ns = time.time_ns() if tracing.enabled() else 0
        for i in range(0, len(requests), PLACE_CHUNK):
            decisions += self.s.placement.place(requests[i : i + PLACE_CHUNK])
            await asyncio.sleep(0)  # let heartbeats and lease keep-alives run between engine passes
        self.s.metrics.decided(decisions)
        placed: list[Placed] = []
        attempts = 0  # each costs a fresh snapshot (O(nodes)): a few per pass, the rest retried later
        for n, decision, request in zip(needs, decisions, requests, strict=True):
            if decision.node_id is None:
                if request.priority > 0 and attempts < PREEMPTIONS_PER_PASS:
                    attempts += 1
                    if await self.preempt(n, request):
                        continue
                reason = await self.mark_pending(n, decision)
                if started_ns:
                    placement_tracing.record(n, decision, "Pending", started_ns, reason)
                continue
            placed.append(Placed(n, decision, decided_ns=started_ns))
        # Many placements per transaction: one etcd revision (and one fsync) for up to
        # PLACEMENTS_PER_TXN of them instead of one each.
        for i in range(0, len(placed), PLACEMENTS_PER_TXN):
            await self.slots.acquire()
            # In flight from here on (not before: if this pass fails part-way, place_isolated
            # releases what it reserved for instances that never reached a commit).
            self.inflight.update(p.instance for p in placed[i : i + PLACEMENTS_PER_TXN])
            task = asyncio.create_task(self.commit(placed[i : i + PLACEMENTS_PER_TXN]))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def preempt(self, n: Need, request: pl.WorkloadRequest) -> bool:
        def place_unit(decision: pl.Decision, now: float, note: str) -> Unit:
            st = self.s.state.statuses.get(n.instance)
            return placement_unit(Placed(n, decision), st.value if st else None, now, note=note)

        return await try_preempt(self.s, n, request, place_unit)

    async def mark_pending(self, n: Need, decision: pl.Decision) -> str:
        """Record that no node fits; returns the explanation (as the status says it)."""
        st = self.s.state.statuses.get(n.instance)
        status = pending_status(st.value if st else None, decision, time.time(),
                                self.s.placement.record_of(n.instance, decision))
        if status is None:
            return st.value.message if st else ""
        w, inst = n.workload, n.instance
        await self.s.state.commit([Compare(keys.workload(w.id), n.wrev)], [Put(keys.status(inst), status.to_json())])
        self.s.emit("WorkloadPending", f"workload/{w.id}", f"{inst}: {status.message}" if inst != w.id
                    else status.message, "Unschedulable")
        return status.message

    @staticmethod
    def trace(batch: list[Placed], landed: list[Placed]) -> None:
        done = {p.instance for p in landed}
        placement_tracing.record_batch([
            placement_tracing.Decided(p.need, p.decision, "Scheduled" if p.instance in done else "NotCommitted",
                                      p.decided_ns, p.explanation, p.instance in done)
            for p in batch if p.decided_ns])

    async def commit(self, batch: list[Placed]) -> None:
        """Commit a batch of decisions in one transaction (if a guard fails because a workload
        changed meanwhile, the others still land: see group_commit)."""
        landed: list[Placed] = []
        broken: list[tuple[Placed, Exception]] = []
        statuses = self.s.state.statuses
        try:
            units, built = [], []
            homed: set[str] = set()  # a volume record is written by one placement of a batch at most
            for p in batch:
                try:  # one placement whose documents cannot be built must not hold back the rest
                    st = statuses.get(p.instance)
                    homes = [h for h in unhomed_local_volumes(p.need.workload, self.s.state.volumes)
                             if h.value.id not in homed]
                    homed.update(h.value.id for h in homes)
                    units.append(placement_unit(p, st.value if st else None, time.time(), homes,
                                                seen=self.s.placement.record_of(p.instance, p.decision)))
                    built.append(p)
                except Exception as err:
                    broken.append((p, err))
            oks = await commit_units(self.s.state.commit, units, sizes=self.s.metrics.batch_sizes)
            landed = [p for p, ok in zip(built, oks, strict=True) if ok]
        except Exception as err:
            log.warning("committing %d placements failed: %s", len(batch), err)
        finally:
            for p in batch:
                self.inflight.discard(p.instance)
            self.slots.release()
        if tracing.enabled():
            self.trace(batch, landed)
        for p in landed:
            wid, inst = p.need.workload.id, p.instance
            self.s.emit("WorkloadScheduled", f"workload/{wid}", f"{inst}: {p.explanation}" if inst != wid
                        else p.explanation, "Scheduled", node=p.decision.node_id or "")
            if p.moved_from:
                self.s.emit("Relocated", f"workload/{wid}", f"{inst}: {p.moved_from} -> {p.decision.node_id}",
                            "Relocated", node=p.decision.node_id or "")
        done = {p.instance for p in landed}
        for p, failure in broken:
            done.add(p.instance)
            self.s.placement.release(p.instance)
            await self.mark_failed(p.need.workload.id, [p.instance], failures.INTERNAL_ERROR, failure)
        for p in batch:
            if p.instance not in done:
                self.s.placement.release(p.instance)
                self.s.enqueue(p.need.workload.id)  # lost a race with a concurrent change, or the store failed
