"""`explain W --at REV`: re-run a recorded decision on the store as it was at REV.

Each decision's status records the mirror revision its snapshot was built from and what it saw
beyond the store (placement.record.seen: in-flight reservations, nodes not heard from, observed
load, the engine's configuration tag). The replay reads the nodes, assignments, workloads and
volumes at that revision (etcd's MVCC, or the embedded store's history), builds a mirror and a
snapshot from them exactly as the live replica does (`PlacementService`), adds the recorded
reservations, decides again and compares the answer with the one recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from persys.model.workload import instance_id
from persys.scheduler import placement as pl
from persys.scheduler.errors import NotFound
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import ClusterState
from persys.scheduler.placement import record as precord
from persys.scheduler.placing.engine_adapter import PlacementService, to_request
from persys.store.base import CompactedError, FutureRevision, HistoryReads, KeyValue, StateStore

# What a snapshot is built from; statuses are read one instance at a time (the pinned node of a
# node-local volume), revision records and the rest never matter to a decision.
_PREFIXES = (keys.NODES, keys.ASSIGNMENTS, keys.WORKLOADS, keys.VOLUMES)


class ReplayRefused(Exception):
    """The decision cannot be replayed exactly; `code` is the gRPC status that says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def recorded(state: ClusterState, wid: str, at: int) -> list[tuple[str, dict[str, Any]]]:
    """The instances of `wid` whose current decision was taken on the store at revision `at`,
    with its stored placement document."""
    cur = state.workloads.get(wid)
    if cur is None:
        raise NotFound(f"workload {wid!r}")
    found, others = [], []
    for i in range(cur.value.spec.replicas):
        inst = instance_id(wid, i)
        st = state.statuses.get(inst)
        doc = st.value.placement if st is not None else {}
        rev = (doc.get("seen") or {}).get("rev")
        if rev == at:
            found.append((inst, doc))
        elif rev is not None:
            others.append(f"{inst} at {rev}")
    if not found:
        known = f"its replicas' decisions were taken at: {', '.join(others)}" if others else \
            "none of its replicas has a recorded decision yet"
        raise ReplayRefused("NOT_FOUND", f"no decision of workload {wid} was taken at revision {at} ({known})")
    return found


async def read_at(store: StateStore, at: int, instances: list[str]) -> list[KeyValue]:
    if not isinstance(store, HistoryReads):
        raise ReplayRefused("FAILED_PRECONDITION", f"the state store ({type(store).__name__}) cannot read past "
                                                   "revisions")
    try:
        kvs = []
        for prefix in _PREFIXES:
            kvs += await store.range_at(prefix, at)
        for inst in instances:
            kvs += [kv for kv in await store.range_at(keys.status(inst), at) if kv.key == keys.status(inst)]
    except CompactedError as err:
        raise ReplayRefused("OUT_OF_RANGE", f"cannot replay the decision taken at revision {at}: {err}") from None
    except FutureRevision as err:
        raise ReplayRefused("INVALID_ARGUMENT", f"at: {err}") from None
    return kvs


def replay_one(state: ClusterState, config: pl.PlacementConfig, wid: str, inst: str,
               doc: Mapping[str, Any]) -> dict[str, Any]:
    """Decide `inst` again on `state` (the mirror as of the recorded revision) with what the
    record says the decision saw beyond it; the answer beside the recorded one."""
    seen = doc["seen"]
    if seen.get("engine") != precord.engine_tag(config):
        raise ReplayRefused("FAILED_PRECONDITION", f"{inst}: decided by engine/config {seen.get('engine')}, this "
                                                   f"replica runs {precord.engine_tag(config)}: a replay would not "
                                                   "be the same decision")
    if seen.get("omitted"):
        raise ReplayRefused("FAILED_PRECONDITION", f"{inst}: the decision saw more than its record keeps "
                                                   f"({seen['omitted']} entries beyond the bound): it cannot be "
                                                   "replayed exactly")
    cur = state.workloads.get(wid)
    if cur is None:
        raise ReplayRefused("NOT_FOUND", f"workload {wid} did not exist at revision {seen['rev']}")
    unheard = set(seen.get("unheard", ()))
    load = seen.get("observed", {})
    svc = PlacementService(state, config)
    svc.heard = lambda node_id: node_id not in unheard
    svc.observed = lambda node_id: (load[node_id][0], load[node_id][1]) if node_id in load else None
    st = state.statuses.get(inst)
    pinned = st.value.volume_node if st is not None and st.value.volume_node else None
    request = to_request(cur.value, inst, pinned, state.volumes)
    ledger = pl.Reservations()
    for r in precord.replay_reservations(seen, request.group):
        ledger.reserve(r)
    decision = pl.decide(svc.base().with_reservations(ledger.view()), request, config)
    explanation = decision.explain() if decision.node_id is not None else decision.explain_detailed()
    recorded_text = doc.get("explanation", "")
    # A placement's stored explanation may end with a note the decision did not make (whom a
    # preemption moved): the engine's own text is its beginning.
    agrees = decision.node_id == doc.get("node_id") and (recorded_text == explanation or (
        decision.node_id is not None and recorded_text.startswith(explanation + ";")))
    return {
        "instance": inst,
        "recorded": {"node": doc.get("node_id") or "", "explanation": recorded_text},
        "replayed": {"node": decision.node_id or "", "explanation": explanation, "decision": decision.to_dict()},
        "seen": {k: v for k, v in seen.items() if k != "rev"},
        "agrees": agrees,
    }


async def replay(live: ClusterState, config: pl.PlacementConfig, wid: str, at: int) -> dict[str, Any]:
    """Every replica of `wid` whose current decision was taken at revision `at`, replayed."""
    if at <= 0:
        raise ReplayRefused("INVALID_ARGUMENT", f"at: revision must be a positive integer, not {at}")
    found = recorded(live, wid, at)
    kvs = await read_at(live.store, at, [inst for inst, _ in found])

    def again() -> list[dict[str, Any]]:
        past = ClusterState(live.store)
        past.replace(kvs, at)
        return [replay_one(past, config, wid, inst, doc) for inst, doc in found]

    # Parsing a large cluster's documents and building its snapshot takes seconds at tens of
    # thousands of workloads: off the event loop (the past mirror is this call's own).
    replicas = await asyncio.to_thread(again)
    return {"workload": wid, "at": at, "agrees": all(r["agrees"] for r in replicas), "replicas": replicas}
