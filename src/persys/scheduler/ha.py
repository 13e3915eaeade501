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
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol

from persys.scheduler import keys
from persys.store.base import Compare, KeepAliveSchedule, LeaseKeeper, Put, StateStore, StoreError

log = logging.getLogger(__name__)


class BlockingLease(Protocol):
    def keep_alive(self, lease_id: int, timeout: float | None = None) -> float: ...

    def close(self) -> None: ...


class ThreadedLeaseKeeper:
    """Keeps a lease alive from a plain thread, with a blocking connection of its own.

    A leader whose event loop is saturated (a burst of thousands of placements) must not lose its
    lease for that alone: deposition would throw away its queue and reservations, and a re-election
    storm is worse than a slow leader. A crashed process still loses the lease within the TTL, and
    every write stays fenced, so this only removes false depositions. The thread uses no event
    loop at all (see persys.store.etcd.BlockingLease); `lost` is an event of the loop that started
    the keeper.
    """

    def __init__(self, lease_factory: Callable[[], BlockingLease], lease_id: int, ttl: float) -> None:
        self.lease_factory = lease_factory
        self.lease_id = lease_id
        self.ttl = ttl
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
                    try:
                        schedule.refreshed(lease.keep_alive(self.lease_id, timeout=self.ttl))
                    except StoreError as err:
                        if schedule.failed(err):
                            break
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
    def __init__(
        self,
        store: StateStore,
        replica_id: str,
        address: str,
        on_elected: Callable[[], Awaitable[None]],
        on_deposed: Callable[[], Awaitable[None]],
        ttl: float = 2.0,
        blocking_lease: Callable[[], BlockingLease] | None = None,
    ) -> None:
        self.store = store
        self.replica_id = replica_id
        self.address = address
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.ttl = ttl
        self.blocking_lease = blocking_lease  # given: keep-alives from a thread, on their own connection
        self.fence_revision = 0  # mod revision of our leader key while we lead; 0 otherwise
        self._task: asyncio.Task[None] | None = None
        self._lease = 0
        # Set once the first campaign has an outcome (won, or someone else leads), so a starting
        # replica can answer "am I active?" before serving.
        self.settled = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        return self.fence_revision > 0

    def fence(self) -> list[Compare]:
        """The compare every write of the active replica carries."""
        return [Compare(keys.LEADER, self.fence_revision)] if self.fence_revision else []

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="leader-election")

    async def stop(self) -> None:
        lease = self._lease
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if lease:
            # Step down at once so a standby need not wait for the lease to expire.
            with contextlib.suppress(Exception):
                await self.store.revoke_lease(lease)
            self._lease = 0

    async def _run(self) -> None:
        while True:
            try:
                await self._campaign_once()
            except asyncio.CancelledError:
                raise
            except StoreError as err:
                log.warning("leader election: %s; retrying", err)
            except Exception:
                log.exception("leader election failed; retrying")
            await asyncio.sleep(self.ttl / 4)

    async def _campaign_once(self) -> None:
        lease = await self.store.grant_lease(self.ttl)
        self._lease = lease
        keeper: LeaseKeeper | ThreadedLeaseKeeper = (
            ThreadedLeaseKeeper(self.blocking_lease, lease, self.ttl) if self.blocking_lease
            else LeaseKeeper(self.store, lease, self.ttl)
        )
        keeper.start()
        try:
            value = json.dumps({"id": self.replica_id, "address": self.address}).encode()
            while not keeper.lost.is_set():
                rev = await self.store.txn([Compare(keys.LEADER, 0)], [Put(keys.LEADER, value, lease)])
                if rev is not None:
                    await self._lead(rev, keeper)
                    return
                self.settled.set()
                await self._wait_for_vacancy(keeper)
        finally:
            await keeper.stop()
            self._lease = 0

    async def _lead(self, revision: int, keeper: LeaseKeeper | ThreadedLeaseKeeper) -> None:
        self.fence_revision = revision
        log.info("replica %s is now the active scheduler (fence revision %d)", self.replica_id, revision)
        try:
            await self.on_elected()
            self.settled.set()
            await keeper.lost.wait()
            log.warning("replica %s lost its leader lease", self.replica_id)
        finally:
            self.fence_revision = 0
            await self.on_deposed()

    async def _wait_for_vacancy(self, keeper: LeaseKeeper | ThreadedLeaseKeeper) -> None:
        """Return when the leader key is gone (or our own lease was lost)."""
        start = await self.store.current_revision() + 1
        if await self.store.get(keys.LEADER) is None:
            return
        watch = self.store.watch(keys.LEADER, start_revision=start)
        lost = asyncio.ensure_future(keeper.lost.wait())
        try:
            while True:
                nxt = asyncio.ensure_future(anext(watch))
                done, _ = await asyncio.wait({nxt, lost}, return_when=asyncio.FIRST_COMPLETED)
                if lost in done:
                    nxt.cancel()
                    return
                ev = nxt.result()
                if ev.type == "delete" and ev.kv.key == keys.LEADER:
                    return
        finally:
            lost.cancel()
            with contextlib.suppress(Exception):
                await watch.aclose()  # type: ignore[attr-defined]


def leader_address(value: bytes | None) -> str:
    if not value:
        return ""
    try:
        return str(json.loads(value).get("address", ""))
    except (ValueError, AttributeError):
        return ""
