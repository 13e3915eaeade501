"""Clients' buckets on Ceph RGW: create, read, delete, and their keys. Any replica may take them.

The store keeps the binding only (`/persys/buckets/<name>`, compare-and-swap); RGW holds the
bucket, its objects, its user and keys; the secret store holds each key's values. Each change
writes its intent first (phase Creating or Deleting, a key recorded before RGW makes it), so a
retry after a crash anywhere finds what was begun and finishes it, and a deletion removes whatever
a crash left. RGW and the secret store are called off the event loop (RGW's client blocks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from persys.model.bucket import (
    MAX_KEYS_PER_BUCKET,
    Bucket,
    BucketKey,
    BucketManifest,
    BucketPhase,
    BucketQuota,
    KeyPhase,
    KeyRole,
    key_secret_name,
)
from persys.model.manifest import ManifestError
from persys.scheduler.errors import MutationRefused, NotFound
from persys.scheduler.mirror import keys
from persys.scheduler.rules import buckets as rules
from persys.scheduler.work.shell import Shell
from persys.secrets.base import SecretStore, SecretUnavailable
from persys.storage.base import StorageError, StorageUnavailable
from persys.storage.rgw import RgwAdmin, RgwNotFound, RgwRefused, S3Key
from persys.store.base import Compare, Delete, Put

log = logging.getLogger(__name__)
CAS_ATTEMPTS = 10
MAX_BUCKETS = 10_000
T = TypeVar("T")


class BucketsUnavailable(Exception):
    """RGW (named by its endpoint) or the secret store cannot be reached; nothing was lost: the
    call may be retried. `dependency` names which (the replica itself answered)."""

    def __init__(self, message: str, dependency: str = "rgw") -> None:
        super().__init__(message)
        self.dependency = dependency


class _Gone(MutationRefused):
    """RGW has no such user or bucket (what a retried deletion expects)."""


class BucketApi:
    def __init__(self, shell: Shell, rgw: RgwAdmin | None, secrets: SecretStore | None) -> None:
        self.s = shell
        self.rgw = rgw
        self.secrets = secrets
        self._locks: dict[str, asyncio.Lock] = {}

    # -- plumbing --------------------------------------------------------------------------------

    def _ready(self) -> tuple[RgwAdmin, SecretStore]:
        if self.rgw is None:
            raise MutationRefused("buckets are not configured: start the scheduler with --storage FILE "
                                  "holding an rgw: section (docs/storage.md)")
        if self.secrets is None:
            raise MutationRefused("buckets need the secret store (persys scheduler --secrets) for their keys")
        return self.rgw, self.secrets

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """An RGW call in a thread; its refusals as our errors naming our field."""
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except StorageUnavailable as err:
            raise BucketsUnavailable(str(err)) from None
        except RgwNotFound as err:
            raise _Gone(rules.our_field(str(err))) from None
        except RgwRefused as err:
            message = rules.our_field(str(err))
            if err.code in rules.INVALID_CODES:
                raise ManifestError([message]) from None
            raise MutationRefused(message) from None
        except StorageError as err:
            raise ManifestError([rules.our_field(str(err))]) from None

    async def _secret(self, op: Callable[..., Any], *args: Any) -> Any:
        try:
            return await op(*args)
        except SecretUnavailable as err:
            raise BucketsUnavailable(f"secret store unavailable: {err}", "secret-store") from None

    async def _load(self, name: str) -> tuple[Bucket | None, int]:
        kv = await self.s.store.get(keys.bucket(name))
        if kv is None:
            return None, 0
        return Bucket.model_validate_json(kv.value), kv.mod_revision

    async def _swap(self, name: str, change: Callable[[Bucket], Bucket | None]) -> Bucket | None:
        """Apply `change` to the stored binding with compare-and-swap (None from `change`: delete
        it); the binding written (None: deleted, or there was none)."""
        key = keys.bucket(name)
        for _ in range(CAS_ATTEMPTS):
            cur, rev = await self._load(name)
            if cur is None:
                return None
            new = change(cur)
            op: Put | Delete = Delete(key) if new is None else Put(key, new.to_json())
            if await self.s.store.txn([Compare(key, rev)], [op]) is not None:
                return new
        raise MutationRefused(f"bucket {name} is being changed concurrently; try again")

    def _users(self, names: set[str]) -> list[str]:
        return rules.users_of(names, (w.value for w in self.s.state.workloads.values()))

    def view(self, b: Bucket) -> dict[str, Any]:
        return {**b.to_doc(), "usedBy": self._users(rules.secret_names(b))[:100]}

    # -- reads -----------------------------------------------------------------------------------

    async def get(self, name: str) -> dict[str, Any]:
        b, _ = await self._load(name)
        if b is None:
            raise NotFound(f"bucket {name}")
        doc = self.view(b)
        if self.rgw is not None and b.phase == BucketPhase.READY:
            try:  # RGW's usage: best effort, the binding is the answer
                stats = (await self._call(self.rgw.bucket_info, name)).get("usage", {}).get("rgw.main", {})
                doc["usage"] = {"objects": int(stats.get("num_objects", 0)),
                                "sizeKb": int(stats.get("size_kb_actual", stats.get("size_kb", 0)))}
            except _Gone:  # deleted behind our back: say so now rather than at the watch's next pass
                await self._watch_one(self.rgw, b)
                lost, _ = await self._load(name)
                return self.view(lost) if lost is not None else doc
            except (BucketsUnavailable, MutationRefused, ManifestError) as err:
                doc["usage"] = {"unavailable": str(err)}
        return doc

    async def list_all(self) -> list[dict[str, Any]]:
        kvs, _ = await self.s.store.range(keys.BUCKETS)
        return [self.view(Bucket.model_validate_json(kv.value)) for kv in sorted(kvs, key=lambda kv: kv.key)]

    # -- create ----------------------------------------------------------------------------------

    async def create(self, m: BucketManifest, dry_run: bool = False) -> tuple[Bucket, bool]:
        """The bucket (its RGW user, the bucket, its quota). Returns (binding, created: this call
        made it Ready); a retry resumes a creation a crash or an outage interrupted; a new quota
        is applied to an existing one."""
        if dry_run:
            cur, _ = await self._load(m.metadata.name)
            return (cur or Bucket.from_manifest(m, time.time())), cur is None
        self.s.require_normal()
        rgw, _ = self._ready()
        name = m.metadata.name
        async with self._lock(name):
            cur, _ = await self._load(name)
            if cur is None:
                cur = await self._record(m)
            created = cur.phase == BucketPhase.CREATING  # this call makes it Ready (a retry resumes)
            if cur.phase == BucketPhase.DELETING:
                raise MutationRefused(f"bucket {name} is being deleted; create it again once it is gone")
            if cur.phase == BucketPhase.LOST:
                raise MutationRefused(f"bucket {name} is Lost ({cur.reason}): delete it (persysctl bucket delete "
                                      f"{name}), then create it again")
            if cur.phase == BucketPhase.CREATING:
                await self._provision(rgw, cur)
            if cur.phase == BucketPhase.CREATING or cur.quota != m.spec.quota:
                if cur.quota != m.spec.quota:
                    await self._call(rgw.set_bucket_quota, cur.owner, name, max_size_mb=m.spec.quota.max_size_mb,
                                     max_objects=m.spec.quota.max_objects)
                done = await self._swap(name, lambda b: b.model_copy(update={
                    "phase": BucketPhase.READY, "quota": m.spec.quota, "reason": "", "updated_at": time.time()}))
                if done is None:
                    raise MutationRefused(f"bucket {name} was deleted meanwhile")
                cur = done
                self.s.emit("BucketCreated" if created else "BucketUpdated", f"bucket/{name}", _quota_text(cur))
            return cur, created

    async def _record(self, m: BucketManifest) -> Bucket:
        kvs, _ = await self.s.store.range(keys.BUCKETS)
        if len(kvs) >= MAX_BUCKETS:
            raise ManifestError([f"metadata.name: the cluster holds {len(kvs)} buckets, the most it takes"])
        rec = Bucket.from_manifest(m, time.time())
        # The quota is set (and recorded) once the bucket exists: record it unset for now.
        rec = rec.model_copy(update={"quota": BucketQuota()})
        key = keys.bucket(rec.name)
        if await self.s.store.txn([Compare(key, 0)], [Put(key, rec.to_json())]) is None:
            raise MutationRefused(f"bucket {rec.name} is being created concurrently; try again")
        return rec

    async def _provision(self, rgw: RgwAdmin, b: Bucket) -> None:
        """RGW's user and bucket (both idempotent), then its keys confined to it. A refusal undoes
        both and the binding: nothing stays; unreachable: the binding stays Creating for a retry
        (or a deletion) to finish."""
        try:
            owner = await self._call(rgw.create_user, b.owner, f"Persys bucket {b.name}")
            # A retry after the user was confined (no bucket creation, even its own) finds its
            # bucket there: creating it again would be refused.
            if await self._bucket_owner(rgw, b.name) != b.owner:
                await self._call(rgw.create_bucket, owner, b.name)
            await self._call(rgw.confine_keys, owner, b.name)
        except (MutationRefused, ManifestError):
            await self._call(rgw.delete_user, b.owner)  # purges only what this user owns
            await self._swap(b.name, lambda _b: None)
            raise
        await self._swap(b.name, lambda cur: cur.model_copy(update={"confined": True}))

    async def _bucket_owner(self, rgw: RgwAdmin, name: str) -> str | None:
        """The RGW user owning bucket `name` (None: RGW has no such bucket)."""
        try:
            return str((await self._call(rgw.bucket_info, name)).get("owner", ""))
        except _Gone:
            return None

    # -- the watch: what changed in RGW behind our back ------------------------------------------

    async def watch_pass(self) -> dict[str, str]:
        """One pass over the Ready bindings: a bucket RGW no longer has becomes Lost (with an
        event), a binding from before keys were confined gets them confined. Returns what was
        done to which bucket. RGW unreachable: nothing changes (an outage is not a loss)."""
        if self.rgw is None:
            return {}
        rgw = self.rgw
        done: dict[str, str] = {}
        kvs, _ = await self.s.store.range(keys.BUCKETS)
        for kv in sorted(kvs, key=lambda kv: kv.key):
            b = Bucket.model_validate_json(kv.value)
            if b.phase != BucketPhase.READY:
                continue
            try:
                done.update(await self._watch_one(rgw, b))
            except (MutationRefused, ManifestError) as err:  # this bucket only; the others go on
                log.warning("bucket watch: bucket %s: %s", b.name, err)
        return done

    async def _watch_one(self, rgw: RgwAdmin, b: Bucket) -> dict[str, str]:
        async with self._lock(b.name):
            owner = await self._bucket_owner(rgw, b.name)
            action = rules.watch_action(b, owner)
            if action == rules.WatchAction.LOST:
                reason = (f"RGW has no bucket {b.name} any more (deleted outside Persys)" if owner is None
                          else f"bucket {b.name} in RGW belongs to {owner!r}, not to {b.owner!r}")
                lost = await self._swap(b.name, lambda cur: cur.model_copy(update={
                    "phase": BucketPhase.LOST, "reason": reason, "updated_at": time.time()}))
                if lost is None:
                    return {}
                self.s.emit("BucketLost", f"bucket/{b.name}", reason, reason="Lost")
                return {b.name: "lost"}
            if action == rules.WatchAction.CONFINE:
                key = await self._owner_key(rgw, b.owner)
                if key is None:
                    return {}
                await self._call(rgw.confine_keys, key, b.name)
                await self._swap(b.name, lambda cur: cur.model_copy(update={"confined": True}))
                self.s.emit("BucketKeysConfined", f"bucket/{b.name}",
                            "its keys can no longer create buckets, delete it or change its policy")
                return {b.name: "confined"}
        return {}

    # -- delete ----------------------------------------------------------------------------------

    async def delete(self, name: str, purge: bool = False) -> tuple[bool, bool]:
        """Remove the bucket, its keys (RGW and secrets) and its RGW user. Returns (deleted,
        already_gone). Refused while a workload references one of its keys, and while it holds
        objects unless `purge`."""
        self.s.require_normal()
        rgw, secrets = self._ready()
        async with self._lock(name):
            cur, _ = await self._load(name)
            if cur is None:
                return False, True
            if cur.phase != BucketPhase.DELETING:
                users = self._users(rules.secret_names(cur))
                if users:
                    raise MutationRefused(f"bucket {name}: its keys are referenced by workload {rules.shown(users)}: "
                                          "delete those workloads (or their references) first")
                cur = await self._mark_deleting(name, purge)
            # Through the admin API: the bucket's policy forbids every S3 key, ours too, to delete it.
            if await self._bucket_owner(rgw, name) == cur.owner:
                try:
                    await self._call(rgw.remove_bucket, name, purge_objects=cur.purge)
                except MutationRefused as err:
                    await self._swap(name, lambda b: b.model_copy(update={"phase": BucketPhase.READY, "purge": False,
                                                                          "reason": ""}))
                    if "BucketNotEmpty" in str(err):
                        raise MutationRefused(f"bucket {name} holds objects: delete them, or delete the bucket with "
                                              "purge (persysctl bucket delete --purge)") from None
                    raise
            for sname in sorted(rules.secret_names(cur)):
                await self._secret(secrets.delete, sname)
            await self._call(rgw.delete_user, cur.owner)
            await self._swap(name, lambda _b: None)
        self.s.emit("BucketDeleted", f"bucket/{name}", "objects purged" if cur.purge else "empty")
        return True, False

    async def _mark_deleting(self, name: str, purge: bool) -> Bucket:
        done = await self._swap(name, lambda b: b.model_copy(update={
            "phase": BucketPhase.DELETING, "purge": purge, "reason": "deletion requested",
            "updated_at": time.time()}))
        if done is None:
            raise NotFound(f"bucket {name}")
        return done

    async def _owner_key(self, rgw: RgwAdmin, uid: str) -> S3Key | None:
        """The owning user's own S3 key (None: the user is gone, and its bucket with it)."""
        try:
            own = [k for k in await self._call(rgw.user_keys, uid) if k.user == uid]
        except _Gone:
            return None
        return own[0] if own else await self._call(rgw.create_key, uid)

    # -- keys ------------------------------------------------------------------------------------

    async def create_key(self, name: str, role: str) -> BucketKey:
        """A new key with `role`, its values stored as the secret `bucket-<name>-<id>`. An earlier
        attempt that did not finish (same role) is finished instead of starting another."""
        try:
            want = KeyRole(role)
        except ValueError:
            raise ManifestError([f"role: {role[:40]!r} is not a key role (read-only or admin)"]) from None
        self.s.require_normal()
        rgw, secrets = self._ready()
        async with self._lock(name):
            cur, _ = await self._load(name)
            if cur is None:
                raise NotFound(f"bucket {name}")
            if cur.phase != BucketPhase.READY:
                raise MutationRefused(f"bucket {name} is {cur.phase.value}: keys are made for a Ready bucket")
            key = next((k for k in cur.keys if k.phase == KeyPhase.CREATING and k.role == want), None)
            if key is None:
                if len(cur.keys) >= MAX_KEYS_PER_BUCKET:
                    raise MutationRefused(f"bucket {name} has {len(cur.keys)} keys, the most it keeps")
                key = BucketKey(id=rules.new_key_id(k.id for k in cur.keys), role=want, created_at=time.time())
                pending = key
                if await self._swap(name, lambda b: b.model_copy(update={"keys": [*b.keys, pending]})) is None:
                    raise NotFound(f"bucket {name}")
            made = await self._call(rgw.create_named_key, cur.owner, key.id, rules.rgw_access(want))
            sname = key_secret_name(name, key.id)
            await self._secret(secrets.put, sname, rules.key_secret_data(name, rgw.endpoint, made.access_key,
                                                                        made.secret_key))
            ready = key.model_copy(update={"phase": KeyPhase.READY, "access_key_id": made.access_key,
                                           "secret": sname})
            done = await self._swap(name, lambda b: b.model_copy(update={
                "keys": [ready if k.id == ready.id else k for k in b.keys]}))
            if done is None:
                raise NotFound(f"bucket {name}")
        self.s.emit("BucketKeyCreated", f"bucket/{name}", f"key {key.id} ({want.value}), secret {sname}")
        return ready

    async def list_keys(self, name: str) -> list[dict[str, Any]]:
        b, _ = await self._load(name)
        if b is None:
            raise NotFound(f"bucket {name}")
        return [k.to_doc() for k in b.keys]

    async def delete_key(self, name: str, key_id: str) -> tuple[bool, bool]:
        """The RGW key and its secret; refused while a workload references the secret."""
        self.s.require_normal()
        rgw, secrets = self._ready()
        async with self._lock(name):
            cur, _ = await self._load(name)
            if cur is None:
                raise NotFound(f"bucket {name}")
            key = cur.key(key_id)
            if key is None:
                return False, True
            users = self._users(rules.secret_names(cur, [key]))
            if users:
                raise MutationRefused(f"key {key_id} of bucket {name} is referenced by workload {rules.shown(users)}: "
                                      "delete those workloads (or their references) first")
            await self._delete_subuser(rgw, cur.owner, key_id)
            await self._secret(secrets.delete, key_secret_name(name, key_id))
            await self._swap(name, lambda b: b.model_copy(update={"keys": [k for k in b.keys if k.id != key_id]}))
        self.s.emit("BucketKeyDeleted", f"bucket/{name}", f"key {key_id}")
        return True, False

    async def _delete_subuser(self, rgw: RgwAdmin, uid: str, key_id: str) -> None:
        try:
            found = [k for k in await self._call(rgw.user_keys, uid) if k.user == f"{uid}:{key_id}"]
        except _Gone:
            return
        for k in found:
            await self._call(rgw.delete_key, uid, k.access_key)


def _quota_text(b: Bucket) -> str:
    q = b.quota
    parts = [f"{q.max_size_mb} MiB" if q.max_size_mb else "", f"{q.max_objects} objects" if q.max_objects else ""]
    return "quota " + (", ".join(p for p in parts if p) or "none")

