"""Bucket keys stay inside their bucket (issue #30, finding 7), BucketApi in process against the
session's real RGW with boto3 acting as each key: neither key can create another bucket, delete its
bucket or change the bucket's policy or ACL; the read-only key cannot put; reading (and, with the
admin key, writing) works. Persys still deletes the bucket (through the admin API). A bucket
deleted in RGW behind Persys' back becomes Lost with an event; a binding made before keys were
confined (its keys could create buckets) is confined by the watch's next pass."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from persys.model.bucket import Bucket, BucketPhase, rgw_user_of
from persys.scheduler.api.buckets import BucketApi
from persys.scheduler.mirror import keys
from persys.secrets.builtin import BuiltinSecretStore
from persys.secrets.keyfile import load_or_create
from persys.storage.rgw import NO_BUCKETS, RgwAdmin, RgwNotFound
from persys.store.sqlite import SqliteStore
from tests.buckets.test_bucket_resume import _Shell, manifest
from tests.ceph_cluster import CephCluster


def client(endpoint: str, access: str, secret: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=access,
                        aws_secret_access_key=secret,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def refused(call: Any, **kwargs: Any) -> str:
    """The error code RGW answered `call` with; fails the test when RGW accepted it."""
    try:
        call(**kwargs)
    except ClientError as err:
        return str(err.response["Error"]["Code"])
    raise AssertionError(f"{call.__name__}({kwargs}) was accepted")


async def key_client(api: BucketApi, secrets: BuiltinSecretStore, bucket: str, role: str) -> Any:
    key = await api.create_key(bucket, role)
    data, _ = await secrets.get(key.secret)
    return client(data["S3_ENDPOINT"].decode(), data["AWS_ACCESS_KEY_ID"].decode(),
                  data["AWS_SECRET_ACCESS_KEY"].decode())


class Harness:
    """BucketApi over a SQLite store, the builtin secret store and the real RGW (made inside the
    test's event loop)."""

    def __init__(self, ceph: CephCluster, tmp: Path) -> None:
        self.ceph, self.tmp = ceph, tmp

    async def __aenter__(self) -> tuple[BucketApi, BuiltinSecretStore, RgwAdmin, _Shell]:
        self.store = SqliteStore(self.tmp / "state.db")
        secrets = BuiltinSecretStore(self.store, load_or_create(self.tmp / "secrets.key"), self.tmp / "secrets.key")
        self.rgw = RgwAdmin(self.ceph.rgw_endpoint, self.ceph.rgw_admin_access_key, self.ceph.rgw_admin_secret_key)
        shell = _Shell(self.store)
        return BucketApi(shell, self.rgw, secrets), secrets, self.rgw, shell  # type: ignore[arg-type]

    async def __aexit__(self, *exc: object) -> None:
        self.rgw.close()
        await self.store.close()


def test_keys_cannot_leave_their_bucket(ceph_cluster: CephCluster, tmp_path: Path) -> None:
    name, other = f"scope-{uuid.uuid4().hex[:6]}", f"scope-other-{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        async with Harness(ceph_cluster, tmp_path) as (api, secrets, rgw, _):
            b, _ = await api.create(manifest(name))
            assert b.phase == BucketPhase.READY and b.confined
            try:
                ro = await key_client(api, secrets, name, "read-only")
                rw = await key_client(api, secrets, name, "admin")
                assert rw.put_object(Bucket=name, Key="a.txt", Body=b"written")  # the admin key writes
                for who, s3 in (("read-only", ro), ("admin", rw)):
                    assert s3.get_object(Bucket=name, Key="a.txt")["Body"].read() == b"written", who
                    assert [o["Key"] for o in s3.list_objects_v2(Bucket=name)["Contents"]] == ["a.txt"], who
                    assert refused(s3.create_bucket, Bucket=other) in ("AccessDenied", "TooManyBuckets"), who
                    assert refused(s3.delete_bucket, Bucket=name) == "AccessDenied", who
                    assert refused(s3.delete_bucket_policy, Bucket=name) == "AccessDenied", who
                    assert refused(s3.put_bucket_policy, Bucket=name, Policy="{}") in ("AccessDenied",
                                                                                      "MalformedPolicy"), who
                    assert refused(s3.put_bucket_acl, Bucket=name, ACL="public-read-write") == "AccessDenied", who
                assert refused(ro.put_object, Bucket=name, Key="b.txt", Body=b"x") == "AccessDenied"
                assert refused(ro.delete_object, Bucket=name, Key="a.txt") == "AccessDenied"
                assert rw.delete_object(Bucket=name, Key="a.txt")  # objects stay the admin key's
                with pytest.raises(RgwNotFound):
                    rgw.bucket_info(other)
                assert rgw.user_max_buckets(rgw_user_of(name)) == NO_BUCKETS
                assert rgw.bucket_info(name)["owner"] == rgw_user_of(name)  # still there, still ours
            finally:
                assert await api.delete(name, purge=True) == (True, False)  # Persys itself still can
            with pytest.raises(RgwNotFound):
                rgw.bucket_info(name)

    asyncio.run(run())


def test_bucket_deleted_behind_our_back_is_lost(ceph_cluster: CephCluster, tmp_path: Path) -> None:
    name = f"lost-{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        async with Harness(ceph_cluster, tmp_path) as (api, _, rgw, shell):
            await api.create(manifest(name))
            assert await api.watch_pass() == {}  # there and confined: nothing to do
            rgw.remove_bucket(name, purge_objects=True)  # an RGW admin, not Persys
            assert await api.watch_pass() == {name: "lost"}
            doc = await api.get(name)
            assert doc["phase"] == "Lost" and "deleted outside Persys" in doc["reason"]
            assert ("BucketLost", f"bucket/{name}") in [(k, s) for k, s, _ in shell.events]
            assert await api.watch_pass() == {}  # said once
            other = f"lost-get-{uuid.uuid4().hex[:6]}"
            await api.create(manifest(other))
            rgw.remove_bucket(other, purge_objects=True)
            assert (await api.get(other))["phase"] == "Lost"  # a get finds it at once, not at the next pass
            assert [s for k, s, _ in shell.events if k == "BucketLost"] == [f"bucket/{name}", f"bucket/{other}"]
            assert await api.delete(other) == (True, False)
            with pytest.raises(Exception, match="is Lost"):
                await api.create(manifest(name))
            with pytest.raises(Exception, match="Ready bucket"):
                await api.create_key(name, "admin")
            assert await api.delete(name) == (True, False)  # what is left (user, binding) goes
            assert await api.s.store.get(keys.bucket(name)) is None
            with pytest.raises(RgwNotFound):
                rgw.user_keys(rgw_user_of(name))

    asyncio.run(run())


def test_a_binding_from_before_is_confined_by_the_watch(ceph_cluster: CephCluster, tmp_path: Path) -> None:
    name, other = f"old-{uuid.uuid4().hex[:6]}", f"old-other-{uuid.uuid4().hex[:6]}"
    uid = rgw_user_of(name)

    async def run() -> None:
        async with Harness(ceph_cluster, tmp_path) as (api, _, rgw, shell):
            # As a scheduler before this change left it: user, bucket, a full key, no confinement.
            owner = rgw.create_user(uid, f"Persys bucket {name}")
            rgw.create_bucket(owner, name)
            key = rgw.create_named_key(uid, "abc123", "full")
            now = time.time()
            old = Bucket(name=name, owner=uid, phase=BucketPhase.READY, created_at=now, updated_at=now)
            await api.s.store.put(keys.bucket(name), old.to_json())
            s3 = client(rgw.endpoint, key.access_key, key.secret_key)
            try:
                s3.create_bucket(Bucket=other)  # what the old keys could do
                s3.delete_bucket(Bucket=other)
                assert await api.watch_pass() == {name: "confined"}
                assert "BucketKeysConfined" in [k for k, _, _ in shell.events]
                assert refused(s3.create_bucket, Bucket=other) in ("AccessDenied", "TooManyBuckets")
                assert refused(s3.delete_bucket, Bucket=name) == "AccessDenied"
                b, _ = await api._load(name)
                assert b is not None and b.confined and b.phase == BucketPhase.READY
                assert await api.watch_pass() == {}
            finally:
                await api.delete(name, purge=True)
                rgw.delete_user(uid)

    asyncio.run(run())
