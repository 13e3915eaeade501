"""The scheduler keeps each workload's revision history durably, bounded, in the same writes as the
workload (on the embedded SQLite store and on a real etcd): apply, change, change again and
roll back; pruning beyond KEEP_REVISIONS; a rollback to an unknown generation refused naming
it; the records in a backup and back after a restore; gone with the workload; a record that
would not fit in the store's request left out while the apply lands; bulk creates recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from persys.events.memory import MemoryEventBus
from persys.model import DesiredState, ManifestError, WorkloadManifest, parse_manifests
from persys.model.revision import WorkloadRevision
from persys.scheduler.mirror import keys
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.rules.revisions import KEEP_REVISIONS
from persys.store import open_store
from tests.waiting import until


def manifest(command: list[str], labels: dict[str, str] | None = None, env: dict[str, str] | None = None
             ) -> WorkloadManifest:
    doc = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "web", "labels": labels or {}},
           "spec": {"type": "process", "process": {"command": command, "env": env or {}}}}
    return parse_manifests(json.dumps(doc))[0]


async def stored(s: Scheduler) -> dict[int, WorkloadRevision]:
    kvs, _ = await s.store.range(keys.revisions_of("web"))
    return {WorkloadRevision.model_validate_json(kv.value).generation: WorkloadRevision.model_validate_json(kv.value)
            for kv in kvs}


async def test_history_rollback_pruning_backup_and_deletion(store_url: str, tmp_path: Path) -> None:
    s = Scheduler(open_store(store_url), MemoryEventBus())
    await s.start()
    try:
        v1, v2 = manifest(["sleep", "60"]), manifest(["sleep", "120"])
        v3 = manifest(["sleep", "180"], labels={"tier": "web"})
        await s.workload_api.apply(v1)
        await s.workload_api.apply(v2)
        await s.workload_api.apply(manifest(["sleep", "120"], labels={"tier": "web"}))  # labels only: no new revision
        await s.workload_api.apply(v3)
        assert sorted(await stored(s)) == [1, 2, 3]
        assert s.state.revision_generations["web"] == {1, 2, 3}
        history = await s.workload_api.revisions("web")
        assert [r.spec.process.command for r in history if r.spec.process] == [
            ["sleep", "60"], ["sleep", "120"], ["sleep", "180"]]
        assert [r.revision for r in history] == [v1.spec.spec_revision(), v2.spec.spec_revision(),
                                                 v3.spec.spec_revision()]

        await s.workload_api.set_desired_state("web", DesiredState.STOPPED)  # generation 4, no record
        m, target = await s.workload_api.rollback_manifest("web")
        assert target == 2 and m.metadata.labels == {"tier": "web"}  # labels are the current ones
        w, created, changed = await s.workload_api.apply(m, rollback_of=target)
        assert (created, changed, w.generation) == (False, True, 5)
        assert w.spec.process is not None and w.spec.process.command == ["sleep", "120"]
        assert w.spec.desired_state == DesiredState.RUNNING  # the spec as applied then
        records = await stored(s)
        assert sorted(records) == [1, 2, 3, 5] and records[5].rollback_of == 2
        assert records[5].spec == records[2].spec

        with pytest.raises(ManifestError, match=r"^generation: workload 'web' has no revision at generation 4 "):
            await s.workload_api.rollback_manifest("web", 4)
        assert s.state.workloads["web"].value.generation == 5  # nothing written

        for i in range(KEEP_REVISIONS + 2):  # pruned in the same writes: never more than the bound
            await s.workload_api.apply(manifest(["sleep", str(1000 + i)]))
            assert len(await stored(s)) <= KEEP_REVISIONS
        kept = await stored(s)
        assert sorted(kept) == list(range(8, 18)) and s.state.revision_generations["web"] == set(kept)

        other = Scheduler(open_store(store_url), MemoryEventBus())  # the mirror index from a load
        await other.state.load()
        assert other.state.revision_generations == s.state.revision_generations
        await other.store.close()

        backup = await s.backups.backup()
        backed = {i["key"] for i in backup["items"] if i["key"].startswith(keys.REVISIONS)}
        assert backed == {keys.revision("web", g) for g in kept}
        restored = Scheduler(open_store(f"sqlite:///{tmp_path / 'restored.db'}"), MemoryEventBus())
        await restored.start()
        try:
            await restored.backups.restore(backup, force=True)
            assert [r.generation for r in await restored.workload_api.revisions("web")] == sorted(kept)
            assert restored.state.revision_generations["web"] == set(kept)
        finally:
            await restored.stop()
            await restored.store.close()

        await s.workload_api.delete("web")  # no node runs it: the workload and its history go at once
        await until(lambda: "web" not in s.state.workloads)
        await until(lambda: "web" not in s.state.revision_generations)
        assert await stored(s) == {}
    finally:
        await s.stop()
        await s.store.close()


async def test_leftovers_oversized_specs_and_bulk_creates(store_url: str) -> None:
    s = Scheduler(open_store(store_url), MemoryEventBus())
    await s.start()
    try:
        # A record an earlier workload of the name left (a deletion's later chunk that failed).
        stray = WorkloadRevision(workload="web", generation=7, revision="x", spec=manifest(["true"]).spec,
                                 created_at=1.0)
        await s.store.put(keys.revision("web", 7), stray.to_json())
        await until(lambda: s.state.revision_generations.get("web") == {7})
        await s.workload_api.apply(manifest(["sleep", "60"]))
        assert sorted(await stored(s)) == [1]

        # A spec of ~1 MB fits the store's request alone, not twice: applied, not recorded.
        big = manifest(["sleep", "61"], env={"BLOB": "x" * 900_000})
        w, _, changed = await s.workload_api.apply(big)
        assert changed and w.generation == 2
        assert sorted(await stored(s)) == [1]
        await s.workload_api.apply(manifest(["sleep", "62"]))  # the history goes on after it
        assert sorted(await stored(s)) == [1, 3]

        # A bulk apply's creates carry their first record in the same units.
        bulk = [parse_manifests(json.dumps({**manifest(["true"]).model_dump(mode="json", by_alias=True),
                                            "metadata": {"name": f"bulk-{i}"}}))[0] for i in range(3)]
        assert [created for _, created, _ in await s.workload_api.apply_many(bulk)] == [True] * 3
        for i in range(3):
            assert [r.generation for r in await s.workload_api.revisions(f"bulk-{i}")] == [1]
    finally:
        await s.stop()
        await s.store.close()
