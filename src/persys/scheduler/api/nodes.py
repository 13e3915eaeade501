"""Operators' changes to nodes (cordon, drain, labels, taints, deletion). Any replica may make
them: compare-and-swap on the node's document; what follows (relocation off a draining node,
placement on an uncordoned one) comes from reconciliation reacting to the mirror."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from persys.model import Assignment, Node, Phase, Taint, WorkloadStatus
from persys.scheduler.api.workloads import CAS_ATTEMPTS, WorkloadApi
from persys.scheduler.errors import MutationRefused, NotFound
from persys.scheduler.interpret.group_commit import Unit, commit_units
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import Versioned
from persys.scheduler.work.shell import Shell
from persys.store.base import Compare, Delete, Put


def withdrawal_from_deleted(node_id: str, inst: str, a: Versioned[Assignment], prev: WorkloadStatus | None,
                            now: float) -> Unit:
    """Withdraw one instance from a node being deleted: it is placed elsewhere once its status
    no longer points at a node that runs it (the node is gone: nothing to wait for)."""
    akey = keys.assignment(node_id, inst)
    new = (prev or WorkloadStatus()).model_copy(update={
        "phase": Phase.PENDING, "reason": "Relocating", "relocating_from": node_id, "left_node": "",
        "message": f"node {node_id} was deleted by an operator; moving it elsewhere", "updated_at": now,
    })
    return Unit([Compare(akey, a.mod_revision)], [Delete(akey), Put(keys.status(inst), new.to_json())])


class NodeApi:
    def __init__(self, shell: Shell, workloads: WorkloadApi, forget: Callable[[str], None]) -> None:
        self.s = shell
        self.workloads = workloads  # its compare-and-swap loop serves node documents too
        self.forget = forget  # drops what the replica keeps in memory about a deleted node

    async def update_node(self, node_id: str, change: Callable[[Node], Node]) -> Node:
        """Apply an operator's change to a node document (compare-and-swap, any replica)."""
        node, _ = await self.workloads.cas_change(keys.node(node_id), f"node {node_id!r}",
                                                  lambda: self.s.state.nodes.get(node_id), change)
        return node

    async def cordon(self, node_id: str, on: bool = True) -> Node:
        def change(n: Node) -> Node:
            n.cordoned = on
            if not on:
                n.draining, n.drain_deadline = False, 0.0
            return n

        node = await self.update_node(node_id, change)
        self.s.emit("NodeCordoned" if on else "NodeUncordoned", f"node/{node_id}", "by an operator")
        return node

    async def drain(self, node_id: str, deadline_seconds: float) -> Node:
        def change(n: Node) -> Node:
            n.cordoned, n.draining = True, True
            n.drain_deadline = time.time() + deadline_seconds if deadline_seconds > 0 else 0.0
            return n

        node = await self.update_node(node_id, change)
        self.s.emit("NodeDraining", f"node/{node_id}", f"{len(self.s.state.assignments.get(node_id, {}))} "
                    "instances to move")
        return node

    async def label(self, node_id: str, set_labels: dict[str, str], remove: list[str]) -> Node:
        def change(n: Node) -> Node:
            n.admin_labels = {k: v for k, v in {**n.admin_labels, **set_labels}.items() if k not in remove}
            return n

        return await self.update_node(node_id, change)

    async def taint(self, node_id: str, add: list[Taint], remove: list[str]) -> Node:
        """Add operator taints; `remove` holds keys or key:Effect to drop."""

        def dropped(t: Taint) -> bool:
            return t.key in remove or f"{t.key}:{t.effect}" in remove

        def change(n: Node) -> Node:
            kept = [t for t in n.admin_taints if not dropped(t) and (t.key, t.effect) not in
                    {(a.key, a.effect) for a in add}]
            # When each taint was added (NoExecute's tolerationSeconds count from it); adding the
            # same taint again keeps its time.
            since = {(t.key, t.value, t.effect): t.added_at for t in n.admin_taints}
            now = time.time()
            added = [t.model_copy(update={"added_at": since.get((t.key, t.value, t.effect)) or now}) for t in add]
            n.admin_taints = kept + added
            return n

        return await self.update_node(node_id, change)

    async def delete_node(self, node_id: str, force: bool = False) -> dict[str, Any]:
        """Remove a node from the cluster (any replica; compare-and-swap). Refused while instances
        are assigned to it unless `force`, which first withdraws them (they are placed elsewhere,
        as off a lost node). An agent that registers again later joins as a new node."""
        self.s.require_normal()
        state = self.s.state
        key = keys.node(node_id)
        withdrawn: set[str] = set()
        for _ in range(CAS_ATTEMPTS):
            cur = state.nodes.get(node_id)
            if cur is None:
                raise NotFound(f"node {node_id!r}")
            assigned = dict(state.assignments.get(node_id, {}))
            if assigned and not force:
                names = ", ".join(sorted(assigned)[:5]) + (", ..." if len(assigned) > 5 else "")
                raise MutationRefused(
                    f"node {node_id} still has {len(assigned)} instance(s) assigned ({names}): drain it first "
                    f"(persysctl drain {node_id}), or delete it with --force to withdraw them and place them "
                    "elsewhere")
            units = []
            for inst, a in sorted(assigned.items()):
                st = state.statuses.get(inst)
                units.append(withdrawal_from_deleted(node_id, inst, a, st.value if st else None, time.time()))
            oks = await commit_units(lambda c, o: state.commit(c, o, fenced=False), units)
            withdrawn |= {inst for inst, ok in zip(sorted(assigned), oks, strict=True) if ok}
            # The key goes once nothing is assigned any more, guarded by the revision judged.
            # Its attachment records go with it (what the node held is its drivers' to fence).
            attached = sorted(state.attachments.get(node_id, {}))
            if all(oks) and await state.commit([Compare(key, cur.mod_revision)],
                                               [Delete(key), *(Delete(keys.attachment(node_id, v)) for v in attached)],
                                               fenced=False):
                self.forget(node_id)
                for vid in attached:
                    self.s.emit("VolumeDetached", f"volume/{vid}", f"from node {node_id}: the node was deleted",
                                node=node_id)
                self.s.enqueue_pending()  # what waited for this node to stop it is placed now
                self.s.emit("NodeDeleted", f"node/{node_id}", "deleted by an operator" + (
                    f"; {len(withdrawn)} instance(s) withdrawn to be placed elsewhere" if withdrawn else ""),
                    "Forced" if withdrawn else "Deleted")
                return {"node": node_id, "deleted": True, "withdrawn": sorted(withdrawn)}
            await self.s.refresh(key)
        raise MutationRefused(f"node {node_id!r} is being changed concurrently; try again")
