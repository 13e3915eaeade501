"""The placement pipeline: decide nodes for a batch of needs in one engine pass (reserving as
it goes), then commit the decisions concurrently, many to a transaction. The documents a
decision becomes are built by pure functions; `Placer` does the I/O for the replica's shell."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from persys.model import WorkloadStatus
from persys.model.volume import Volume
from persys.model.workload import instance_id
from persys.observability import tracing
from persys.scheduler import placement as pl
from persys.scheduler.decide import step
from persys.scheduler.decide.effects import Guard, Need, Write, put
from persys.scheduler.decide.placed import Placed, pending_write, placement_write
from persys.scheduler.interpret.group_commit import FENCE_HEADROOM, TXN_MAX_OPS, Unit
from persys.scheduler.interpret.ops import store_write
from persys.scheduler.mirror.follower import Versioned
from persys.scheduler.placing import tracing as placement_tracing
from persys.scheduler.placing.engine_adapter import to_request
from persys.scheduler.rules import failures
from persys.scheduler.work import instance_move
from persys.scheduler.work.preemption import try_preempt
from persys.scheduler.work.shell import Shell, interpreter_for
from persys.store.base import StoreUnavailable

log = logging.getLogger(__name__)
PLACE_CHUNK = 128  # placements decided between two yields to the event loop
PREEMPTIONS_PER_PASS = 4  # preemption attempts per engine pass (each ~0.1 s at 5,000 nodes)
# Each placement carries two compares and two puts; with the leader fence that stays within
# etcd's default --max-txn-ops of 128 per branch.
PLACEMENTS_PER_TXN = (TXN_MAX_OPS - FENCE_HEADROOM) // 2


def placement_unit(p: Placed, prev: WorkloadStatus | None, now: float,
                   homes: Sequence[Versioned[Volume]] = (), note: str = "") -> Unit:
    """One decision's write as a store unit (preemption commits it with its evictions)."""
    return Unit(*store_write(placement_write(p, prev, now, homes, note)))


class Placer:
    def __init__(self, shell: Shell) -> None:
        self.s = shell
        self.inflight: set[str] = set()  # instances whose placement is being committed
        self.slots = asyncio.Semaphore(shell.config.commit_concurrency)
        self.tasks: set[asyncio.Task[None]] = set()
        self.interpreter = interpreter_for(shell)

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
                    await self.interpreter.write(Write([Guard("workload", wid, cur.mod_revision)],
                                                       [put("status", inst, new)]))
        except Exception:
            log.exception("could not record the failure of %s", wid)

    async def place(self, needs: list[Need]) -> None:
        requests = self._requests(needs)
        decisions: list[pl.Decision] = []
        started_ns = time.time_ns() if tracing.enabled() else 0
        for i in range(0, len(requests), PLACE_CHUNK):
            decisions += self.s.placement.place(requests[i : i + PLACE_CHUNK])
            await asyncio.sleep(0)  # let heartbeats and lease keep-alives run between engine passes
        self._retry_unpinned(requests, decisions)
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

    def _requests(self, needs: list[Need]) -> list[pl.WorkloadRequest]:
        """The engine's requests: pinned to a volume's node, or to a move's verified destination."""
        state = self.s.state
        requests = []
        for n in needs:
            st = state.statuses.get(n.instance)
            pinned = st.value.volume_node if st and st.value.volume_node else None
            requests.append(instance_move.moved_request(
                to_request(n.workload, n.instance, pinned, state.volumes), st.value if st else None))
        return requests

    def _retry_unpinned(self, requests: list[pl.WorkloadRequest], decisions: list[pl.Decision]) -> None:
        """A moved instance whose verified destination no longer fits goes anywhere but where it
        came from (never left Pending for want of that one node): both lists updated in place."""
        for i, request in enumerate(requests):
            if decisions[i].node_id is None and (retry := instance_move.unpinned(request, self.s.state.statuses.get(
                    request.id))) is not None:
                requests[i] = retry
                decisions[i] = self.s.placement.place([retry])[0]

    async def preempt(self, n: Need, request: pl.WorkloadRequest) -> bool:
        def place_unit(decision: pl.Decision, now: float, note: str) -> Unit:
            st = self.s.state.statuses.get(n.instance)
            return placement_unit(Placed(n, decision), st.value if st else None, now, note=note)

        return await try_preempt(self.s, n, request, place_unit)

    async def mark_pending(self, n: Need, decision: pl.Decision) -> str:
        """Record that no node fits; returns the explanation (as the status says it)."""
        st = self.s.state.statuses.get(n.instance)
        w = pending_write(n, st.value if st else None, decision, time.time(),
                          self.s.placement.record_of(n.instance, decision))
        if w is None:
            return st.value.message if st else ""
        await self.interpreter.write(w)  # WorkloadPending is published once it is written
        status = w.intents[0].doc
        assert isinstance(status, WorkloadStatus)
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
        landed: list[tuple[Placed, Write]] = []
        broken: list[tuple[Placed, Exception]] = []
        try:
            for p in batch:  # what each decision saw beyond the store, kept with it (explain --at)
                p.seen = self.s.placement.record_of(p.instance, p.decision)
            fx, broken = step.on_placed(self.s.state, batch, time.time())
            failed = {id(p) for p, _ in broken}
            built = [p for p in batch if id(p) not in failed]
            oks = await self.interpreter.planner.land(fx.writes, grouped=True)
            landed = [(p, w) for p, w, ok in zip(built, fx.writes, oks, strict=True) if ok]
        except Exception as err:
            log.warning("committing %d placements failed: %s", len(batch), err)
        finally:
            for p in batch:
                self.inflight.discard(p.instance)
            self.slots.release()
        if tracing.enabled():
            self.trace(batch, [p for p, _ in landed])
        for _, w in landed:
            self.interpreter.publish(w.events)
        done = {p.instance for p, _ in landed}
        for p, failure in broken:
            done.add(p.instance)
            self.s.placement.release(p.instance)
            await self.mark_failed(p.need.workload.id, [p.instance], failures.INTERNAL_ERROR, failure)
        for p in batch:
            if p.instance not in done:
                self.s.placement.release(p.instance)
                self.s.enqueue(p.need.workload.id)  # lost a race with a concurrent change, or the store failed
