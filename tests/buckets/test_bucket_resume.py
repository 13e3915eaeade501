"""BucketApi in process against the session's real RGW: with RGW unreachable a creation answers
unavailable naming the endpoint and leaves its intent (the binding in Creating, nothing else);
asked again once RGW is back it finishes; a key begun while RGW was down is finished by the next
attempt; deletion resumes from Deleting. The shell is the smallest the API uses (a SQLite store, no
replica): the API only reads the store, the workloads and emits events."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from persys.model.bucket import BucketManifest, BucketPhase, KeyPhase, rgw_user_of
from persys.scheduler.api.buckets import BucketApi, BucketsUnavailable
from persys.scheduler.mirror import keys
from persys.secrets.builtin import BuiltinSecretStore
from persys.secrets.keyfile import load_or_create
from persys.storage.rgw import RgwAdmin, RgwNotFound
from persys.store.sqlite import SqliteStore
from tests.ceph_cluster import CephCluster
from tests.fixtures_infra import free_port


class _State:
    workloads: dict[str, Any] = {}


class _Shell:
    """What BucketApi takes of a replica: the store, the mirror's workloads, events, the mode."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.state = _State()
        self.events: list[tuple[str, str, str]] = []

    def emit(self, kind: str, subject: str, message: str, reason: str = "", node: str = "") -> None:
        self.events.append((kind, subject, message))

    def require_normal(self) -> None:
        pass


def manifest(name: str, **quota: int) -> BucketManifest:
    return BucketManifest.model_validate({"apiVersion": "persys.dev/v1", "kind": "Bucket",
                                          "metadata": {"name": name}, "spec": {"quota": quota}})


def test_interrupted_creation_key_and_deletion_resume(ceph_cluster: CephCluster, tmp_path: Path) -> None:
    async def run() -> None:
        store = SqliteStore(tmp_path / "state.db")
        secrets = BuiltinSecretStore(store, load_or_create(tmp_path / "secrets.key"), tmp_path / "secrets.key")
        good = RgwAdmin(ceph_cluster.rgw_endpoint, ceph_cluster.rgw_admin_access_key,
                        ceph_cluster.rgw_admin_secret_key)
        down_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        down = RgwAdmin(down_url, ceph_cluster.rgw_admin_access_key, ceph_cluster.rgw_admin_secret_key, timeout_s=3)
        shell = _Shell(store)
        api = BucketApi(shell, down, secrets)  # type: ignore[arg-type]
        name = f"resume-{uuid.uuid4().hex[:6]}"
        try:
            with pytest.raises(BucketsUnavailable, match=f"RGW at {down_url} unreachable"):
                await api.create(manifest(name, maxObjects=7))
            b, _ = await api._load(name)
            assert b is not None and b.phase == BucketPhase.CREATING
            with pytest.raises(RgwNotFound):
                good.user_keys(rgw_user_of(name))  # nothing in RGW yet

            api.rgw = good  # RGW is back: asking again finishes the creation
            b, created = await api.create(manifest(name, maxObjects=7))
            assert b.phase == BucketPhase.READY and created and b.quota.max_objects == 7
            assert (await api.create(manifest(name, maxObjects=7)))[1] is False  # Ready: nothing to do
            assert good.bucket_info(name)["bucket_quota"]["max_objects"] == 7

            api.rgw = down  # a key begun while RGW is down is recorded, not made
            with pytest.raises(BucketsUnavailable):
                await api.create_key(name, "admin")
            pending = (await api._load(name))[0]
            assert pending is not None and [k.phase for k in pending.keys] == [KeyPhase.CREATING]
            api.rgw = good
            key = await api.create_key(name, "admin")  # the same key finished, not a second one
            assert key.id == pending.keys[0].id and key.phase == KeyPhase.READY
            assert sorted((await secrets.get(key.secret))[0]) == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                                 "S3_BUCKET", "S3_ENDPOINT"]

            # A deletion interrupted after its intent was written resumes.
            await api._mark_deleting(name, purge=False)
            api.rgw = down
            with pytest.raises(BucketsUnavailable):
                await api.delete(name)
            api.rgw = good
            assert await api.delete(name) == (True, False)
            assert await store.get(keys.bucket(name)) is None
            assert key.secret not in await secrets.names()
            with pytest.raises(RgwNotFound):
                good.bucket_info(name)
            with pytest.raises(RgwNotFound):
                good.user_keys(rgw_user_of(name))
            assert [k for k, _, _ in shell.events] == ["BucketCreated", "BucketKeyCreated", "BucketDeleted"]
        finally:
            api.rgw = good
            await api.delete(name, purge=True)
            good.close()
            down.close()
            await store.close()

    asyncio.run(run())
