"""Clients' changes to volume objects (apply, delete) and reads. Any replica may take them: each
is a compare-and-swap on the volume's record. The data itself is provisioned, attached and
removed by the nodes (persys.storage drivers through the agents), not here."""

from __future__ import annotations

import time
from typing import Any

from persys.model.manifest import ManifestError
from persys.model.volume import (
    MAX_SNAPSHOTS,
    SNAPSHOT_RE,
    Volume,
    VolumeManifest,
    VolumePhase,
    has_data,
    volume_problems,
)
from persys.scheduler.errors import MutationRefused, NotFound
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import DocPut, Versioned
from persys.scheduler.rules.volumes import (
    clone_home,
    delete_refusal,
    source_problems,
    standalone_reclaim_problem,
    users_index,
    users_of,
)
from persys.scheduler.work.shell import Shell
from persys.store.base import Compare, Delete, Put

CAS_ATTEMPTS = 10
MAX_VOLUMES = 100_000  # records the cluster keeps at most (the API refuses more)


class VolumeApi:
    def __init__(self, shell: Shell) -> None:
        self.s = shell

    def view(self, v: Volume) -> dict[str, Any]:
        return {**v.to_doc(), "usedBy": users_of(v.id, (w.value for w in self.s.state.workloads.values()))[:100],
                "attachments": self._attachments(v.id)}

    def _attachments(self, vid: str) -> list[dict[str, Any]]:
        state = self.s.state
        out = []
        for node in sorted(state.attached_on.get(vid, ())):
            if (a := state.attachments.get(node, {}).get(vid)) is not None:
                doc = a.value.to_doc()
                out.append({k: doc[k] for k in ("node", "kind", "readOnly", "instances", "since")})
        return out

    def get(self, vid: str) -> dict[str, Any]:
        cur = self.s.state.volumes.get(vid)
        if cur is None:
            raise NotFound(f"volume {vid}")
        return self.view(cur.value)

    def list(self) -> list[dict[str, Any]]:
        users = users_index(w.value for w in self.s.state.workloads.values())
        return [{**v.value.to_doc(), "usedBy": users.get(vid, [])[:100], "attachments": self._attachments(vid)}
                for vid, v in sorted(self.s.state.volumes.items())]

    async def apply(self, m: VolumeManifest, dry_run: bool = False) -> tuple[Volume, bool, bool]:
        """Create or update (grow, relabel) a volume. Returns (volume, created, changed); idempotent."""
        if not dry_run:
            self.s.require_normal()
        for _ in range(CAS_ATTEMPTS):
            cur = self.s.state.volumes.get(m.metadata.name)
            done = await (self._create(m, dry_run) if cur is None else self._update(m, cur, dry_run))
            if done is not None:
                return done
            await self.s.refresh(keys.volume(m.metadata.name))
        raise MutationRefused(f"volume {m.metadata.name} is being changed concurrently; try again")

    async def _create(self, m: VolumeManifest, dry_run: bool) -> tuple[Volume, bool, bool] | None:
        state = self.s.state
        problems = source_problems(m, {k: v.value for k, v in state.volumes.items()})
        if reclaim := standalone_reclaim_problem(m.spec, owner=""):
            problems.append(reclaim)
        if len(state.volumes) >= MAX_VOLUMES:
            problems.append(f"metadata.name: the cluster holds {len(state.volumes)} volumes, "
                            f"the most it takes ({MAX_VOLUMES})")
        if problems:
            raise ManifestError(problems)
        rec = Volume.from_manifest(m, time.time())
        home = clone_home(m, {k: v.value for k, v in state.volumes.items()})
        if home != rec.node:
            rec = rec.model_copy(update={"node": home})
        if dry_run:
            return rec, True, True
        key = keys.volume(rec.id)
        if not await state.commit([Compare(key, state.rev_of(key))], [DocPut(key, rec.to_json(), doc=rec)],
                                  fenced=False):
            return None
        self.s.emit("VolumeCreated", f"volume/{rec.id}", f"{rec.spec.driver}, {rec.spec.size_mb} MiB")
        return rec, True, True

    async def _update(self, m: VolumeManifest, cur: Versioned[Volume], dry_run: bool
                      ) -> tuple[Volume, bool, bool] | None:
        v = cur.value
        if v.phase == VolumePhase.DELETING:
            raise MutationRefused(f"volume {v.id} is being deleted; apply it again once it is gone")
        spec = m.spec if m.spec.node else m.spec.model_copy(update={"node": v.spec.node})
        problems = volume_problems(spec, v.spec)
        if reclaim := standalone_reclaim_problem(spec, v.owner):
            problems.append(reclaim)
        if problems:
            raise ManifestError(problems)
        if spec == v.spec and dict(m.metadata.labels) == v.labels:
            return v, False, False
        updated = v.model_copy(update={"spec": spec, "labels": dict(m.metadata.labels), "updated_at": time.time(),
                                       "generation": v.generation + (spec != v.spec)})
        if dry_run:
            return updated, False, True
        key = keys.volume(v.id)
        if not await self.s.state.commit([Compare(key, cur.mod_revision)],
                                         [DocPut(key, updated.to_json(), doc=updated)], fenced=False):
            return None
        if spec.size_mb != v.spec.size_mb:
            self.s.emit("VolumeResizing", f"volume/{v.id}", f"{v.spec.size_mb} → {spec.size_mb} MiB")
        return updated, False, True

    async def snapshot(self, vid: str, snap: str, delete: bool = False) -> tuple[Volume, bool]:
        """Add `snap` to (or remove it from) the volume's wanted snapshots. Returns (volume,
        changed); idempotent. The volume controller takes it (network volumes), or the node holding
        the data (local ones: node_volumes)."""
        self.s.require_normal()
        if not SNAPSHOT_RE.fullmatch(snap):
            raise ManifestError([f"snapshot: {snap[:80]!r} is not a DNS label"])
        key = keys.volume(vid)
        for _ in range(CAS_ATTEMPTS):
            cur = self.s.state.volumes.get(vid)
            if cur is None:
                raise NotFound(f"volume {vid}")
            v = cur.value
            if v.phase == VolumePhase.DELETING:
                raise MutationRefused(f"volume {vid} is being deleted")
            wanted = [s for s in v.wanted_snapshots if s != snap] + ([] if delete else [snap])
            if wanted == v.wanted_snapshots:
                return v, False
            if len(wanted) > MAX_SNAPSHOTS:
                raise ManifestError([f"snapshot: volume {vid} has {MAX_SNAPSHOTS} snapshots, the most it keeps"])
            updated = v.model_copy(update={"wanted_snapshots": wanted, "updated_at": time.time()})
            if await self.s.state.commit([Compare(key, cur.mod_revision)],
                                         [DocPut(key, updated.to_json(), doc=updated)], fenced=False):
                return updated, True
            await self.s.refresh(key)
        raise MutationRefused(f"volume {vid} is being changed concurrently; try again")

    async def delete(self, vid: str) -> tuple[bool, bool]:
        """Ask for a volume's removal (its data goes too). Returns (deleted, already_gone).
        Refused while a workload uses it; a never-provisioned volume goes at once."""
        self.s.require_normal()
        state = self.s.state
        key = keys.volume(vid)
        for _ in range(CAS_ATTEMPTS):
            cur = state.volumes.get(vid)
            if cur is None:
                return False, True
            v = cur.value
            # A local volume whose node left the cluster: nobody can remove its data any more,
            # so deleting it (again) removes the record, saying so.
            orphaned = v.spec.driver == "local" and bool(v.node) and v.node not in state.nodes
            if v.phase == VolumePhase.DELETING and not orphaned:
                return True, False
            refusal = delete_refusal(v, users_of(vid, (w.value for w in state.workloads.values())))
            if refusal:
                raise MutationRefused(refusal)
            if not has_data(v) or orphaned:
                op: Put | Delete = Delete(key)
            else:
                marked = v.model_copy(update={"phase": VolumePhase.DELETING, "reason": "deletion requested",
                                              "updated_at": time.time()})
                op = DocPut(key, marked.to_json(), doc=marked)
            if await state.commit([Compare(key, cur.mod_revision)], [op], fenced=False):
                gone = (f"its node {v.node} left the cluster: the record removed (data left there is not)"
                        if orphaned else "never provisioned: removed")
                self.s.emit("VolumeDeleting" if isinstance(op, Put) else "VolumeDeleted", f"volume/{vid}",
                            "deletion requested" if isinstance(op, Put) else gone)
                return True, False
            await self.s.refresh(key)
        raise MutationRefused(f"volume {vid} is being changed concurrently; try again")
