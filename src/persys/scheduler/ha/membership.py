"""Which replica serves which node: in sharded (active-active) mode every live replica
announces itself with a leased key, the leader records the live membership as the shard map,
and each node belongs to one member by rendezvous hashing; otherwise the active replica serves
every node. Also the fence that a node-side write (statuses, liveness) carries."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from persys.scheduler.config import SchedulerConfig
from persys.scheduler.decide.shards import encode_members
from persys.scheduler.decide.shards import owner as shard_owner
from persys.scheduler.errors import CatchingUp, NotActive
from persys.scheduler.ha.election import LeaderElection, leader_address
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import ClusterState
from persys.scheduler.mirror.reports import LiveNode
from persys.store.base import Compare, LeaseKeeper, Put, StateStore

log = logging.getLogger(__name__)


class Membership:
    def __init__(self, store: StateStore, state: ClusterState, config: SchedulerConfig, election: LeaderElection,
                 is_active: Callable[[], bool], catching_up: Callable[[], bool]) -> None:
        self.store, self.state, self.config, self.election = store, state, config, election
        self.is_active, self.catching_up = is_active, catching_up
        self.member_rev = 0  # mod revision of our /persys/replicas key (sharded mode)
        self.owned: set[str] = set()

    def owner_of(self, node_id: str) -> str:
        members = self.state.shards[0]
        return shard_owner(node_id, members) if members else ""

    def owns(self, node_id: str) -> bool:
        """Whether this replica serves the node's agent and judges its liveness."""
        if not self.config.sharded:
            return self.is_active()
        # Our own membership write must be in the mirror: nothing older is missing from it then.
        return (self.member_rev > 0 and self.state.revision >= self.member_rev
                and self.owner_of(node_id) == self.election.replica_id)

    def require_owner(self, node_id: str) -> None:
        if not self.owns(node_id):
            if not self.config.sharded:
                if self.catching_up():
                    raise CatchingUp(self.config.advertise, self.state.revision, self.election.fence_revision)
                raise NotActive(self.leader_address())
            raise NotActive(self.state.replicas.get(self.owner_of(node_id), ""))

    def leader_address(self) -> str:
        addr = leader_address(self.state.leader)
        # A replica that is not active never names itself: its mirror may be stale (it was cut off
        # or frozen), and pointing agents back at it would keep them from the real active replica.
        return "" if addr == self.config.advertise and not self.is_active() else addr

    def node_fence(self) -> list[Compare] | None:
        if not self.config.sharded:
            return self.election.fence() if self.election.is_leader else None
        members, rev = self.state.shards
        if not self.member_rev or not rev or self.election.replica_id not in members:
            return None
        # Our membership still holds (lease alive) and the shard map is the one we acted on.
        return [Compare(keys.REPLICAS + self.election.replica_id, self.member_rev), Compare(keys.SHARDS, rev)]

    async def announce(self) -> None:
        """Announce this replica (leased) for as long as it runs; re-announce after a lost lease."""
        key = keys.REPLICAS + self.election.replica_id
        value = json.dumps({"address": self.config.advertise}).encode()
        while True:
            try:
                lease = await self.store.grant_lease(self.config.leader_ttl_seconds)
                keeper = LeaseKeeper(self.store, lease, self.config.leader_ttl_seconds)
                keeper.start()
                try:
                    self.member_rev = await self.store.put(key, value, lease)
                    await keeper.lost.wait()
                finally:
                    self.member_rev = 0
                    await keeper.stop()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("replica membership: %s; retrying", err)
            await asyncio.sleep(self.config.leader_ttl_seconds / 4)

    async def sync_shards(self) -> None:
        """Leader: record the live membership as the shard map when it changed."""
        if not (self.config.sharded and self.is_active()):
            return
        live = set(self.state.replicas)
        members, rev = self.state.shards
        if live and live != set(members):
            await self.state.commit([Compare(keys.SHARDS, rev)], [Put(keys.SHARDS, encode_members(live))])

    def hand_over(self, live: dict[str, LiveNode], now: float) -> None:
        """The shard map changed: newly owned nodes get a fresh grace period (the caller wakes
        every stream, so agents of nodes no longer owned are pointed at their new owner)."""
        owned = {n for n in self.state.nodes if self.owns(n)}
        for n in owned - self.owned:
            entry = live.setdefault(n, LiveNode(now, time.time()))
            entry.last_heartbeat = now
        self.owned = owned
