"""Failover between scheduler replicas: one active replica, elected through a store lease.

The winner holds `/persys/leader` under a lease it keeps alive. Every write the active replica
makes while reconciling carries a compare on that key's revision (the fence), so a replica that
lost its lease (paused, partitioned, slow) can no longer change anything even before it notices.
Standbys keep their state mirror current through the same watch and serve the client API; agents
are pointed at the active replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

from persys.scheduler.ha.takeover import COOLDOWN_TTLS, MIN_HOLD_TTLS, watch_holder
from persys.scheduler.mirror import keys
from persys.store.base import (
    CompactedError,
    Compare,
    KeepAliveSchedule,
    KeyValue,
    LeaseKeeper,
    Put,
    StateStore,
    StoreError,
    WatchEvent,
)

log = logging.getLogger(__name__)
CATCH_UP_TTLS = 5  # an elected replica not ready (mirror caught up) within this many TTLs resigns


class BlockingLease(Protocol):
    def keep_alive(self, lease_id: int, timeout: float | None = None) -> float: ...

    def close(self) -> None: ...


class ThreadedLeaseKeeper:
    """Keeps a lease alive from a plain thread, with a blocking connection of its own.

    A leader whose event loop is saturated (a burst of thousands of placements) must not lose its
    lease for that alone: deposition would throw away its queue and reservations, and a re-election
    storm is worse than a slow leader. A crashed process still loses the lease within the TTL, and
    every write stays fenced, so this only removes false depositions. The thread uses no event
    loop at all (see persys.store.etcd_lease.BlockingLease); `lost` is an event of the loop that started
    the keeper.
    """

    def __init__(self, lease_factory: Callable[[], BlockingLease], lease_id: int, ttl: float,
                 granted_at: float | None = None) -> None:
        self.lease_factory = lease_factory
        self.lease_id = lease_id
        self.ttl = ttl
        # Until when the lease is certainly alive: the send time of the last confirmed request
        # (the grant, then each keep-alive) plus the TTL. Read without a lock: a float swap.
        self.confirmed_until = (time.monotonic() if granted_at is None else granted_at) + ttl
        self.lost = asyncio.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def run() -> None:
            lease = self.lease_factory()
            schedule = KeepAliveSchedule(self.lease_id, self.ttl)
            try:
                while not self._stop.wait(schedule.interval):
                    # A call must not outlive the lease it refreshes: wait at most until the
                    # confirmed lifetime ends, then the lease is presumed lost.
                    sent = time.monotonic()
                    budget = self.confirmed_until - sent
                    if budget <= 0:
                        log.warning("lease %x: no keep-alive confirmed for its whole TTL", self.lease_id)
                        break
                    try:
                        remaining = lease.keep_alive(self.lease_id, timeout=budget)
                    except StoreError as err:
                        if schedule.failed(err) or time.monotonic() >= self.confirmed_until:
                            break
                        continue
                    schedule.refreshed(remaining)
                    # etcd restarts the TTL when it receives the request, after we sent it.
                    self.confirmed_until = sent + min(self.ttl, remaining)
                else:
                    return  # stopped
                with contextlib.suppress(RuntimeError):  # the loop may be closing
                    loop.call_soon_threadsafe(self.lost.set)
            except Exception:
                log.exception("lease keeper thread failed")
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self.lost.set)
            finally:
                lease.close()

        self._thread = threading.Thread(target=run, name=f"lease-{self.lease_id:x}", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)


class LeaderElection:
    """Campaign for `/persys/leader`; lead while the lease is confirmed and the key is ours.

    A leader steps down the moment (a) its lease is not confirmed any more (no keep-alive
    confirmed within the TTL, measured from when the last confirmed request was sent: a frozen
    or cut-off process stops counting itself leader as soon as it runs again), or (b) its watch
    of the leader key shows any change after its own write (deleted, or someone else's value).
    While waiting, a standby watches the holder's process (see `takeover`) to take over a dead
    one without waiting for its lease to expire.
    """

    def __init__(
        self,
        store: StateStore,
        replica_id: str,
        address: str,
        on_elected: Callable[[], Awaitable[None]],
        on_deposed: Callable[[], Awaitable[None]],
        ttl: float = 2.0,
        blocking_lease: Callable[[], BlockingLease] | None = None,
        fast_takeover: bool = True,
    ) -> None:
        self.store = store
        self.replica_id = replica_id
        self.address = address
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.ttl = ttl
        self.blocking_lease = blocking_lease  # given: keep-alives from a thread, on their own connection
        self.fast_takeover = fast_takeover
        self.fence_revision = 0  # mod revision of our leader key while we lead; 0 otherwise
        self._task: asyncio.Task[None] | None = None
        self._lease = 0
        self._keeper: LeaseKeeper | ThreadedLeaseKeeper | None = None
        self._resigning = False
        self._pause = 0.0  # how long to wait before the next campaign (after giving up a term)
        # Fast-takeover damping (see takeover): when we first saw the holder's key at its mod
        # revision, and until when we use no fast takeover after our own key was changed.
        self._holder_seen: tuple[int, float] = (0, 0.0)
        self._no_fast_takeover_until = -math.inf
        # Set once the first campaign has an outcome (won, or someone else leads), so a starting
        # replica can answer "am I active?" before serving.
        self.settled = asyncio.Event()

    @property
    def value(self) -> bytes:
        return json.dumps({"id": self.replica_id, "address": self.address}).encode()

    @property
    def is_leader(self) -> bool:
        return self.fence_revision > 0 and not self._resigning and self._lease_confirmed()

    def _lease_confirmed(self) -> bool:
        keeper = self._keeper
        if isinstance(keeper, ThreadedLeaseKeeper):
            return time.monotonic() < keeper.confirmed_until
        return keeper is not None and not keeper.lost.is_set()

    def fence(self) -> list[Compare]:
        """The compare every write of the active replica carries."""
        return [Compare(keys.LEADER, self.fence_revision)] if self.fence_revision else []

    def start(self) -> None:
        self._resigning = False  # started again after stop(): campaign again
        self._task = asyncio.create_task(self._run(), name="leader-election")

    async def stop(self) -> None:
        """Resign: release the lease first (a standby takes over at once), then stop campaigning."""
        lease = self._lease
        self._resigning = True  # no write of ours is fenced valid from here on
        if lease:
            with contextlib.suppress(Exception):
                await self.store.revoke_lease(lease)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._lease = 0

    async def _run(self) -> None:
        while not self._resigning:  # a resigning replica does not campaign again
            try:
                await self._campaign_once()
            except asyncio.CancelledError:
                raise
            except StoreError as err:
                log.warning("leader election: %s; retrying", err)
            except Exception:
                log.exception("leader election failed; retrying")
            pause, self._pause = self._pause, 0.0
            await asyncio.sleep(max(self.ttl / 4, pause))

    async def _campaign_once(self) -> None:
        granted_at = time.monotonic()
        lease = await self.store.grant_lease(self.ttl)
        self._lease = lease
        keeper: LeaseKeeper | ThreadedLeaseKeeper = (
            ThreadedLeaseKeeper(self.blocking_lease, lease, self.ttl, granted_at) if self.blocking_lease
            else LeaseKeeper(self.store, lease, self.ttl)
        )
        keeper.start()
        self._keeper = keeper
        try:
            while not keeper.lost.is_set():
                rev = await self.store.txn([Compare(keys.LEADER, 0)], [Put(keys.LEADER, self.value, lease)])
                if rev is not None:
                    await self._lead(rev, keeper)
                    return
                self.settled.set()
                await self._wait_for_vacancy(keeper)
        finally:
            await keeper.stop()
            self._keeper = None
            self._lease = 0

    async def _lead(self, revision: int, keeper: LeaseKeeper | ThreadedLeaseKeeper) -> None:
        self.fence_revision = revision
        log.info("replica %s is now the active scheduler (fence revision %d)", self.replica_id, revision)
        changed = asyncio.create_task(self._key_changed_after(revision), name="leader-key-watch")
        # Watched from the start: the catch-up in on_elected can take long (a mirror far behind,
        # or reloading), and leadership may be lost meanwhile.
        deposed = asyncio.create_task(self._until_deposed(keeper, changed), name="leader-deposed")
        elected: asyncio.Future[None] = asyncio.ensure_future(self.on_elected())
        try:
            limit = CATCH_UP_TTLS * self.ttl
            first: set[asyncio.Future[Any]] = {elected, deposed}
            done, _ = await asyncio.wait(first, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            if elected in done:
                elected.result()  # its failure ends the term (the election logs it and campaigns again)
                self.settled.set()
                why = await deposed
            elif deposed in done:
                why = deposed.result() + " (while catching up)"
            else:
                # Stuck: a replica that cannot act must not hold the leadership either. Give it up
                # (another replica takes over at once) and campaign again a little later.
                why = f"not ready within {limit:.1f} s of its election ({CATCH_UP_TTLS} x TTL); resigning"
                self._pause = 2 * self.ttl
                with contextlib.suppress(Exception):
                    await self.store.revoke_lease(self._lease)
            log.warning("replica %s steps down: %s", self.replica_id, why)
        finally:
            self.fence_revision = 0
            if changed.done() and not changed.cancelled():
                # Deposed by a change of our key (a fast takeover, perhaps a false one): take
                # nobody's key that way for a while, or two replicas could trade it back and forth.
                self._no_fast_takeover_until = time.monotonic() + COOLDOWN_TTLS * self.ttl
            for t in (elected, deposed, changed):
                t.cancel()
            for t in (elected, deposed, changed):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            await self.on_deposed()

    async def _until_deposed(self, keeper: LeaseKeeper | ThreadedLeaseKeeper, changed: asyncio.Task[str]) -> str:
        lost = asyncio.ensure_future(keeper.lost.wait())
        try:
            while True:
                if not self._lease_confirmed():
                    return "leader lease not confirmed within its TTL"
                # Wake when the confirmed lifetime would end, in case the keeper thread is late.
                left = (keeper.confirmed_until - time.monotonic() if isinstance(keeper, ThreadedLeaseKeeper)
                        else self.ttl)
                done, _ = await asyncio.wait({lost, changed}, timeout=max(left, 0.01) + 0.001,
                                             return_when=asyncio.FIRST_COMPLETED)
                if changed in done:
                    return changed.result()
                if lost in done:
                    return "leader lease lost"
        finally:
            lost.cancel()

    async def _key_changed_after(self, revision: int) -> str:
        """Return when the leader key changes after our own write at `revision`."""
        start = revision + 1
        while True:
            try:
                async for ev in self.store.watch(keys.LEADER, start_revision=start):
                    if ev.kv.key == keys.LEADER:
                        return "leader key deleted" if ev.type == "delete" else "leader key taken by another replica"
            except asyncio.CancelledError:
                raise
            except CompactedError as err:
                # The history since our write is gone: resuming from there would fail forever.
                # Read the key itself instead; unchanged, watch again from now on.
                log.warning("leader key watch: %s; checking the key itself", err)
                try:
                    at = await self.store.current_revision()
                    why = leader_key_change(await self.store.get(keys.LEADER), revision, self.value)
                except StoreError as read_err:
                    log.warning("leader key watch: %s; retrying", read_err)
                    await asyncio.sleep(self.ttl / 10)
                    continue
                if why is not None:
                    return why
                start = at + 1
            except StoreError as err:
                log.debug("leader key watch: %s; resuming", err)
                await asyncio.sleep(self.ttl / 10)

    async def _wait_for_vacancy(self, keeper: LeaseKeeper | ThreadedLeaseKeeper) -> None:
        """Return when the leader key is gone (or our own lease was lost)."""
        start = await self.store.current_revision() + 1
        holder = await self.store.get(keys.LEADER)
        if holder is None:
            return
        if holder.mod_revision != self._holder_seen[0]:
            self._holder_seen = (holder.mod_revision, time.monotonic())
        watch = self.store.watch(keys.LEADER, start_revision=start)
        lost = asyncio.ensure_future(keeper.lost.wait())
        guard: asyncio.Future[bool] = (
            asyncio.ensure_future(watch_holder(self.store, holder, leader_address(holder.value), self.value,
                                               first_seen=self._holder_seen[1], min_hold=MIN_HOLD_TTLS * self.ttl,
                                               cooldown_until=self._no_fast_takeover_until))
            if self.fast_takeover and holder.value != self.value else asyncio.get_running_loop().create_future())
        nxt: asyncio.Future[WatchEvent] | None = None
        try:
            while True:
                if nxt is None:
                    nxt = asyncio.ensure_future(anext(watch))
                waiting: set[asyncio.Future[Any]] = {nxt, lost, guard}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if lost in done:
                    return
                if guard in done:
                    if guard.exception() is None and guard.result():
                        return  # the dead holder's key is cleared: campaign now
                    guard = asyncio.get_running_loop().create_future()  # no verdict: the lease decides
                if nxt in done:
                    ev = nxt.result()
                    nxt = None
                    if ev.type == "delete" and ev.kv.key == keys.LEADER:
                        return
        finally:
            await _stop_waiting(watch, (nxt, lost, guard))


async def _stop_waiting(watch: AsyncIterator[WatchEvent], futures: Iterable[asyncio.Future[Any] | None]) -> None:
    """The vacancy wait's futures cancelled and its watch closed."""
    for f in futures:
        if f is not None:
            f.cancel()
    with contextlib.suppress(Exception):
        await watch.aclose()  # type: ignore[attr-defined]


def leader_key_change(now: KeyValue | None, revision: int, own_value: bytes) -> str | None:
    """Why the leader key as read now is no longer the one we wrote at `revision`; None if it is."""
    if now is None:
        return "leader key deleted"
    if now.mod_revision != revision or now.value != own_value:
        return "leader key taken by another replica"
    return None


def leader_address(value: bytes | None) -> str:
    if not value:
        return ""
    try:
        return str(json.loads(value).get("address", ""))
    except (ValueError, AttributeError):
        return ""
