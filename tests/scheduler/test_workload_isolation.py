"""One workload's failure stays its own: a stored document the model refuses, an engine fault,
a dead worker. The scheduler runs on the embedded store (a real SQLite file); documents are
written straight into the store, as an older version or a restore would."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

import pytest

from persys.model import NodeUsage, Phase, parse_manifests
from persys.scheduler import placement as pl
from persys.scheduler.mirror import keys
from persys.scheduler.placement.framework import Filter, PlacementContext
from persys.scheduler.placement.snapshot import NodeInfo, WorkloadRequest
from persys.scheduler.placement.status import Status
from persys.scheduler.replica.assembly import Scheduler
from persys.store.base import StoreUnavailable
from tests.scheduler import test_core
from tests.scheduler.test_core import manifest, node, settle

make, clock = test_core.make, test_core.clock  # the same scheduler fixtures (pytest finds them here)

# Accepted by the model of earlier versions, refused by today's: the engine cannot evaluate it.
BAD_CONSTRAINT = {"key": "cores", "operator": "Gt", "values": ["lots"]}


def stored_doc(name: str, constraints: list[dict[str, object]] | None = None) -> bytes:
    (m,) = parse_manifests(manifest(name))
    doc = m.spec.to_doc()
    if constraints is not None:
        doc["constraints"] = constraints
    return json.dumps({"id": name, "name": name, "spec": doc, "revision": "r1", "generation": 1,
                       "createdAt": 1.0, "updatedAt": 1.0}).encode()


async def test_a_stored_workload_the_model_refuses_is_marked_and_skipped_and_can_be_deleted(make: Callable) -> None:
    s: Scheduler = await make()
    await s.agent_api.register(node("n1"))
    await s.store.put(keys.workload("bad"), stored_doc("bad", [BAD_CONSTRAINT]))
    for name in ("good-a", "good-b"):
        (m,) = parse_manifests(manifest(name))
        await s.workload_api.apply(m)
    await settle(s, lambda: s.state.placement_of.get("good-a") == "n1" and s.state.placement_of.get("good-b") == "n1")
    await settle(s, lambda: s.state.statuses["bad"].value.reason == "InvalidSpec")
    st = s.state.statuses["bad"].value
    assert st.phase == Phase.FAILED
    assert "spec.constraints[0].values: Gt needs exactly one integer" in st.message
    view = s.workload_view("bad")
    assert view["phase"] == "Failed" and view["reason"] == "InvalidSpec"
    assert await s.store.get(keys.workload("bad")) is not None, "never deleted unasked"
    h = await s.health()
    assert h["mode"] == "normal" and "refused by the model" in h["detail"] and "bad" in h["detail"]
    assert any(e.kind == "WorkloadInvalid" for e in await s.events.recent(limit=100))

    assert await s.workload_api.delete("bad") == (True, False)
    await settle(s, lambda: "bad" not in s.state.refused and "bad" not in s.state.statuses)
    assert await s.store.get(keys.workload("bad")) is None
    assert "refused" not in (await s.health())["detail"]

    # The worker still works after all that.
    (m,) = parse_manifests(manifest("good-c"))
    await s.workload_api.apply(m)
    await settle(s, lambda: s.state.placement_of.get("good-c") == "n1")


async def test_a_refused_stored_workload_is_replaced_by_a_valid_apply(make: Callable) -> None:
    s: Scheduler = await make()
    await s.agent_api.register(node("n1"))
    await s.store.put(keys.workload("fixme"), stored_doc("fixme", [BAD_CONSTRAINT]))
    await settle(s, lambda: "fixme" in s.state.refused)
    (m,) = parse_manifests(manifest("fixme"))
    _, created, _ = await s.workload_api.apply(m)
    assert created
    await settle(s, lambda: s.state.placement_of.get("fixme") == "n1")
    assert "fixme" not in s.state.refused


async def test_refused_stored_workloads_load_at_start_without_crashing_the_mirror(make: Callable) -> None:
    s: Scheduler = await make()
    await s.agent_api.register(node("n1"))
    await s.store.put(keys.workload("old"), stored_doc("old", [{"key": "zone", "operator": "In"}]))
    await s.store.put(keys.workload("junk"), b"not json at all")
    await s.store.put(keys.workload("other"), stored_doc("elsewhere"))  # its id is not its key's
    await s.stop()
    s2: Scheduler = await make()  # loads them from the store
    assert set(s2.state.refused) == {"old", "junk", "other"}
    await settle(s2, lambda: all(s2.state.statuses[w].value.reason == "InvalidSpec" for w in ("old", "junk", "other")))
    assert "(document)" in s2.state.statuses["junk"].value.message or "json" in s2.state.statuses["junk"].value.message
    assert "does not match its key" in s2.state.statuses["other"].value.message
    (m,) = parse_manifests(manifest("fine"))
    s2.agent_api.heartbeat("n1", NodeUsage())  # placement uses only nodes heard from since the restart
    await s2.workload_api.apply(m)
    await settle(s2, lambda: s2.state.placement_of.get("fine") == "n1")


class Poison(Filter):
    """Fault injection: a filter that raises for one workload, as an engine bug would."""

    name = "poison"
    static = False

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return True

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        if request.id.startswith("poison"):
            raise RuntimeError("engine bug on " + request.id)
        return None


async def test_an_engine_fault_marks_its_workload_and_the_batch_is_placed(make: Callable) -> None:
    s: Scheduler = await make()
    s.placement.config = pl.PlacementConfig(filters=(*pl.DEFAULT_FILTERS, Poison()))
    await s.agent_api.register(node("n1", cpu=64_000))
    names = ["a1", "poison", "a2", "a3"]
    await s.workload_api.apply_many(parse_manifests("\n---\n".join(manifest(n) for n in names)))
    await settle(s, lambda: all(s.state.placement_of.get(n) == "n1" for n in ("a1", "a2", "a3")))
    await settle(s, lambda: s.state.statuses["poison"].value.reason == "PlacementError")
    st = s.state.statuses["poison"].value
    assert st.phase == Phase.PENDING and "RuntimeError: engine bug on poison" in st.message
    assert not s.placement.ledger.get("poison") and "poison" not in s.placer.inflight
    assert any(e.kind == "PlacementFailed" for e in await s.events.recent(limit=100))
    h = await s.health()
    assert h["mode"] == "normal"
    # The worker lives on: later workloads are placed, and deleting the failed one completes.
    (m,) = parse_manifests(manifest("later"))
    await s.workload_api.apply(m)
    await settle(s, lambda: s.state.placement_of.get("later") == "n1")
    await s.workload_api.delete("poison")
    await settle(s, lambda: "poison" not in s.state.workloads)


async def test_a_dead_worker_is_reported_and_restarted_and_stop_is_prompt(make: Callable) -> None:
    s: Scheduler = await make()
    await s.agent_api.register(node("n1"))
    real = s.placer.place_isolated
    calls = {"n": 0}

    async def dies_once(needs: list) -> None:  # type: ignore[type-arg]
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("worker bug")
        await real(needs)

    s.placer.place_isolated = dies_once  # type: ignore[method-assign]
    (m,) = parse_manifests(manifest("first"))
    await s.workload_api.apply(m)
    await settle(s, lambda: s.worker_watch.failures == 1)
    h = await s.health()
    assert h["mode"] != "normal" and "reconcile worker failed 1 time(s)" in h["detail"] and "worker bug" in h["detail"]
    await settle(s, lambda: s.state.placement_of.get("first") == "n1")  # the restarted worker did it
    t0 = time.monotonic()
    await asyncio.wait_for(s.stop(), 15)
    assert time.monotonic() - t0 < 10


async def test_a_store_outage_while_marking_pending_requeues_instead_of_failing(make: Callable) -> None:
    s: Scheduler = await make()  # no node: the workload is marked pending, a store write
    real = s.state.commit
    outages = {"left": 2}

    async def flaky(compares: list, ops: list, fenced: bool | str = True) -> bool:  # type: ignore[type-arg]
        if fenced and outages["left"] and any(op.key == keys.status("w") for op in ops):
            outages["left"] -= 1
            raise StoreUnavailable("etcd unreachable (injected)")
        return await real(compares, ops, fenced)

    s.state.commit = flaky  # type: ignore[method-assign]
    (m,) = parse_manifests(manifest("w"))
    await s.workload_api.apply(m)
    await settle(s, lambda: "w" in s.state.statuses and s.state.statuses["w"].value.reason == "Unschedulable",
                 within=10)
    assert outages["left"] == 0
    assert not any(e.kind == "PlacementFailed" for e in await s.events.recent(limit=100))
    assert not s.placement.ledger.get("w")


async def test_deposition_logs_an_active_task_that_had_already_failed(
    make: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    s: Scheduler = await make()

    async def boom() -> None:
        raise RuntimeError("worker bug before deposition")

    t = asyncio.create_task(boom(), name="reconcile-worker")
    await asyncio.wait({t})
    s._active_tasks.append(t)  # ended, its done-callback not (yet) run
    with caplog.at_level(logging.ERROR, logger="persys.scheduler.replica.assembly"):
        await s._deposed()
    assert "RuntimeError: worker bug before deposition" in caplog.text
    assert s._active_tasks == []
