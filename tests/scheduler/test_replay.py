"""`explain --at REV` on a real replica over the embedded store: every decision records the
revision of its snapshot and what it saw beyond the store; a replay on the store as it was then
gives the identical explanation, also for decisions taken while other placements were in flight
and after 500 later changes; a compacted revision is refused naming it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from persys.events.memory import MemoryEventBus
from persys.model import parse_manifests
from persys.model.workload import instance_id
from persys.scheduler.api import replay
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.placement import record as precord
from persys.scheduler.replica.assembly import Scheduler
from persys.store import open_store
from persys.store.sqlite import SqliteStore
from tests.fixtures_infra import start_etcd
from tests.scheduler.test_core import manifest, node
from tests.scheduler.test_node_ops import s, until  # noqa: F401  (the replica fixture)


def differing(answer: dict[str, Any]) -> str:
    """The replicas whose replay differs, recorded against replayed, for the failure message."""
    return json.dumps([{k: r[k] for k in ("instance", "recorded", "seen")} | {"replayed": r["replayed"]["explanation"]}
                       for r in answer["replicas"] if not r["agrees"]], indent=1)


def seen_of(s: Scheduler, inst: str) -> dict[str, Any]:  # noqa: F811
    return dict(s.state.statuses[inst].value.placement["seen"])


async def test_replay_of_a_burst_agrees_including_in_flight_reservations(s: Scheduler) -> None:  # noqa: F811
    for n in ("n1", "n2", "n3"):
        await s.agent_api.register(node(n, cpu=1000, mem=2048))
    # Six replicas of 300m over three nodes of 1000m, decided in one engine pass: each later
    # replica sees the earlier ones only as reservations in flight (none is in the store yet).
    await s.workload_api.apply(parse_manifests(manifest("web", cpu=300, extra="  replicas: 6\n"))[0])
    await s.workload_api.apply(parse_manifests(manifest("big", cpu=900))[0])  # fits nowhere once web is placed
    insts = [instance_id("web", i) for i in range(6)]
    await until(lambda: all(s.state.placement_of.get(i) for i in insts), within=30)
    await until(lambda: s.state.statuses["big"].value.reason == "Unschedulable", within=30)
    records = {i: seen_of(s, i) for i in [*insts, "big"]}
    assert any(r.get("inflight") for r in records.values()), records
    assert all(r["engine"] == precord.engine_tag(s.placement.config) for r in records.values())

    for rev in sorted({r["rev"] for r in records.values()}):
        started = time.monotonic()
        for wid in ("web", "big"):
            if not any(records[i]["rev"] == rev for i in records if i.startswith(wid)):
                continue
            answer = await replay.replay(s.state, s.placement.config, wid, rev)
            assert answer["agrees"], differing(answer)
            for rep in answer["replicas"]:
                assert rep["replayed"]["explanation"] == rep["recorded"]["explanation"]
                assert rep["replayed"]["node"] == rep["recorded"]["node"]
        print(f"replayed revision {rev} in {time.monotonic() - started:.3f}s")

    # The record matters: without the reservations it saw, a decision taken mid-burst comes out
    # otherwise (the reserved room counted as free).
    inst = next(i for i in insts if records[i].get("inflight"))
    doc = dict(s.state.statuses[inst].value.placement)
    past = replay.ClusterState(s.store)
    past.replace(await replay.read_at(s.store, records[inst]["rev"], [inst]), records[inst]["rev"])
    same = replay.replay_one(past, s.placement.config, "web", inst, doc)
    blind = replay.replay_one(past, s.placement.config, "web", inst, doc | {"seen": {**doc["seen"], "inflight": ""}})
    assert same["agrees"] and not blind["agrees"], (same, blind)


async def test_replay_after_500_changes_and_refusals(s: Scheduler) -> None:  # noqa: F811
    for n in ("n1", "n2"):
        await s.agent_api.register(node(n, cpu=2000, mem=2048))
    await s.workload_api.apply(parse_manifests(manifest("old", cpu=500))[0])
    await until(lambda: s.state.placement_of.get("old"), within=30)
    rev = seen_of(s, "old")["rev"]
    before = (await replay.replay(s.state, s.placement.config, "old", rev))["replicas"][0]
    assert before["agrees"], before
    # 500 later changes: labels flipping on both nodes, a cordon, more workloads taking room.
    for i in range(490):
        await s.node_api.label(f"n{1 + i % 2}", {"flip": str(i)}, [])
    await s.node_api.cordon(before["recorded"]["node"])
    for i in range(9):
        await s.workload_api.apply(parse_manifests(manifest(f"later{i}", cpu=100))[0])
    await until(lambda: s.state.revision >= rev + 500, within=30)
    after = await replay.replay(s.state, s.placement.config, "old", rev)
    assert after["agrees"] and after["replicas"][0]["replayed"] == before["replayed"], after

    with pytest.raises(replay.ReplayRefused, match=r"no decision of workload old was taken at revision 3 \(its "
                                                   rf"replicas' decisions were taken at: old at {rev}\)") as nf:
        await replay.replay(s.state, s.placement.config, "old", 3)
    assert nf.value.code == "NOT_FOUND"
    with pytest.raises(replay.ReplayRefused, match="at: revision must be a positive integer") as bad:
        await replay.replay(s.state, s.placement.config, "old", 0)
    assert bad.value.code == "INVALID_ARGUMENT"

    # History compacted past the decision's revision: refused, naming it (gRPC OUT_OF_RANGE,
    # HTTP 410 through the gateway).
    store = s.store
    assert isinstance(store, SqliteStore)
    store.history_limit = 20
    for i in range(30):
        await s.node_api.label("n1", {"more": str(i)}, [])
    with pytest.raises(replay.ReplayRefused, match=rf"cannot replay the decision taken at revision {rev}: "
                                                   rf"revision {rev} has been compacted") as gone:
        await replay.replay(s.state, s.placement.config, "old", rev)
    assert gone.value.code == "OUT_OF_RANGE"


async def test_a_decision_by_another_engine_configuration_is_not_replayed(s: Scheduler) -> None:  # noqa: F811
    await s.agent_api.register(node("n1"))
    await s.workload_api.apply(parse_manifests(manifest("w"))[0])
    await until(lambda: s.state.placement_of.get("w"), within=30)
    rev = seen_of(s, "w")["rev"]
    other = type(s.placement.config)(percentage_of_nodes_to_score=100)
    with pytest.raises(replay.ReplayRefused, match="decided by engine/config e1-") as refused:
        await replay.replay(s.state, other, "w", rev)
    assert refused.value.code == "FAILED_PRECONDITION"


@pytest.mark.parametrize("seed", range(8))
async def test_replay_agrees_over_random_histories(s: Scheduler, seed: int) -> None:  # noqa: F811
    """Seeded random histories of applies (bursts of replicas, spread, selectors, priorities),
    label changes, cordons and deletions: every recorded decision replays to the same answer,
    including those that saw reservations in flight."""
    import random

    rng = random.Random(seed)
    for i in range(4):
        await s.agent_api.register(node(f"n{i}", cpu=rng.choice((800, 1500, 3000)), mem=rng.choice((1024, 2048))))
    names: list[str] = []
    for step in range(14):
        roll = rng.random()
        if roll < 0.55 or not names:
            name = f"w{step}"
            extra = f"  replicas: {rng.randint(1, 5)}\n"
            if rng.random() < 0.3:
                extra += "  spreadBy: zone\n"
            if rng.random() < 0.2:
                extra += "  nodeSelector: {zone: a}\n"
            await s.workload_api.apply(parse_manifests(manifest(name, cpu=rng.choice((100, 300, 700)),
                                                   mem=rng.choice((64, 256, 700)), extra=extra))[0])
            names.append(name)
        elif roll < 0.8:
            await s.node_api.label(f"n{rng.randrange(4)}", {"zone": rng.choice("ab")}, [])
        elif roll < 0.9:
            await s.node_api.cordon(f"n{rng.randrange(4)}", rng.random() < 0.5)
        else:
            await s.workload_api.delete(names.pop(rng.randrange(len(names))))
    await until(lambda: all(s.state.statuses.get(instance_id(w, i)) is not None and
                            s.state.statuses[instance_id(w, i)].value.placement.get("seen")
                            for w in names for i in range(s.state.workloads[w].value.spec.replicas)), within=60)
    replayed = inflight = 0
    for w in names:
        for rev in sorted({seen_of(s, instance_id(w, i))["rev"]
                           for i in range(s.state.workloads[w].value.spec.replicas)}):
            answer = await replay.replay(s.state, s.placement.config, w, rev)
            assert answer["agrees"], differing(answer)
            replayed += len(answer["replicas"])
            inflight += sum(bool(r["seen"].get("inflight")) for r in answer["replicas"])
    print(f"seed {seed}: {replayed} decisions replayed, {inflight} of them with reservations in flight")
    assert replayed


@pytest.mark.etcd
async def test_replay_on_etcd_mvcc_then_compacted(tmp_path: Path) -> None:
    """The same on a private etcd: the burst's decisions replay from etcd's MVCC history; after
    `etcdctl compact` the revision is refused, named (OUT_OF_RANGE: 410 through the gateway)."""
    etcd = start_etcd(tmp_path / "etcd")
    sched = Scheduler(open_store(etcd.url), MemoryEventBus(), SchedulerConfig(node_grace_seconds=10,
                                                                              monitor_interval_seconds=0.02))
    try:
        await sched.start()
        for n in ("n1", "n2"):
            await sched.agent_api.register(node(n, cpu=1000, mem=2048))
        await sched.workload_api.apply(parse_manifests(manifest("web", cpu=300, extra="  replicas: 4\n"))[0])
        insts = [instance_id("web", i) for i in range(4)]
        await until(lambda: all(sched.state.placement_of.get(i) for i in insts), within=60)
        records = {i: seen_of(sched, i) for i in insts}
        assert any(r.get("inflight") for r in records.values()), records
        for rev in sorted({r["rev"] for r in records.values()}):
            answer = await replay.replay(sched.state, sched.placement.config, "web", rev)
            assert answer["agrees"], differing(answer)
        first = min(r["rev"] for r in records.values())
        await sched.node_api.label("n1", {"after": "compaction"}, [])
        etcd.etcdctl("compact", str(await sched.store.current_revision()))
        with pytest.raises(replay.ReplayRefused, match=rf"revision {first} has been compacted") as gone:
            await replay.replay(sched.state, sched.placement.config, "web", first)
        assert gone.value.code == "OUT_OF_RANGE"
    finally:
        await sched.stop()
        await sched.store.close()
        etcd.stop()
