"""RgwAdmin against the fixture's real RGW: users and keys through the admin API, a bucket with a
quota, the user's key reading and writing, a read-only key refused a write, refusals naming the
field, and everything removed again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from botocore.exceptions import ClientError

from persys.storage.base import StorageError
from persys.storage.rgw import RgwAdmin, RgwRefused
from tests.ceph_cluster import CephCluster


@pytest.fixture
def rgw(ceph_cluster: CephCluster) -> Iterator[RgwAdmin]:
    admin = RgwAdmin(ceph_cluster.rgw_endpoint, ceph_cluster.rgw_admin_access_key, ceph_cluster.rgw_admin_secret_key)
    yield admin
    admin.close()


def test_user_bucket_quota_keys_and_cleanup(rgw: RgwAdmin) -> None:
    uid, bucket = f"t-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    key = rgw.create_user(uid, "Test user")
    try:
        assert rgw.create_user(uid) == key  # idempotent: the same key back
        assert key.secret_key not in repr(key)
        rgw.create_bucket(key, bucket)
        rgw.create_bucket(key, bucket)  # its own already: nothing to do
        assert bucket in rgw.list_buckets(key)
        rgw.set_bucket_quota(uid, bucket, max_size_mb=1, max_objects=10)
        quota = rgw.bucket_info(bucket)["bucket_quota"]
        assert quota["enabled"] and quota["max_objects"] == 10 and quota["max_size"] == 1024 * 1024
        s3 = rgw.s3(key)
        s3.put_object(Bucket=bucket, Key="hello.txt", Body=b"hello")
        assert s3.get_object(Bucket=bucket, Key="hello.txt")["Body"].read() == b"hello"
        with pytest.raises(ClientError, match="QuotaExceeded"):
            s3.put_object(Bucket=bucket, Key="big", Body=b"x" * (2 * 1024 * 1024))

        ro = rgw.create_read_only_key(uid, "reader")
        assert rgw.create_read_only_key(uid, "reader") == ro
        reader = rgw.s3(ro)
        assert reader.get_object(Bucket=bucket, Key="hello.txt")["Body"].read() == b"hello"
        with pytest.raises(ClientError, match="AccessDenied"):
            reader.put_object(Bucket=bucket, Key="nope", Body=b"no")
        rgw.delete_key(uid, ro.access_key)
        assert ro.access_key not in {k.access_key for k in rgw.user_keys(uid)}

        with pytest.raises(StorageError, match=r"bucket: .*BucketNotEmpty"):
            rgw.delete_bucket(key, bucket)
        rgw.delete_bucket(key, bucket, purge=True)
        rgw.delete_bucket(key, bucket)  # gone: nothing to do
        assert bucket not in rgw.list_buckets(key)
    finally:
        rgw.delete_user(uid)
    rgw.delete_user(uid)  # idempotent
    with pytest.raises(StorageError, match=r"user: .*NoSuchUser"):
        rgw.user_keys(uid)


def test_refusals_name_the_field(rgw: RgwAdmin, ceph_cluster: CephCluster) -> None:
    uid = f"t-{uuid.uuid4().hex[:8]}"
    key = rgw.create_user(uid)
    try:
        for bad in ("UPPER", "ab", "192.168.1.1", "a..b"):
            with pytest.raises(StorageError, match=r"^bucket: "):
                rgw.create_bucket(key, bad)  # refused before RGW is asked
        with pytest.raises(StorageError, match=r"^user: "):
            rgw.create_user("Bad User")
        with pytest.raises(StorageError, match=r"^quota: "):
            rgw.set_bucket_quota(uid, "some-bucket", max_objects=0)
        other = rgw.create_user(f"{uid}-2")
        try:
            rgw.create_bucket(other, f"{uid}-taken")
            with pytest.raises(RgwRefused, match=r"^bucket: RGW refused .*BucketAlreadyExists") as err:
                rgw.create_bucket(key, f"{uid}-taken")  # RGW's own refusal, the field named
            assert err.value.code == "BucketAlreadyExists"
        finally:
            rgw.delete_user(f"{uid}-2")
        wrong = RgwAdmin(ceph_cluster.rgw_endpoint, ceph_cluster.rgw_admin_access_key, "not-the-secret")
        try:
            with pytest.raises(StorageError, match=r"^credentials: ") as refused:
                wrong.user_keys(uid)
            assert "not-the-secret" not in str(refused.value)
        finally:
            wrong.close()
    finally:
        rgw.delete_user(uid)
