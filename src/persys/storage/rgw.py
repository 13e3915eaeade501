"""`RgwAdmin`: users, S3 keys and bucket quotas on Ceph RGW through its admin REST API (`/admin/user`,
`/admin/bucket`, signed with SigV4 by botocore's signer), and buckets through S3 (boto3, path-style).

Keys are returned to the caller (who keeps them in the secret store) and never logged, never part
of a repr or an exception. Bucket names are checked before RGW is asked (s3_names); what RGW itself
refuses comes back as a StorageError naming the field. Blocking calls, bounded by `timeout_s`.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import boto3
import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError

from persys.storage.base import StorageError, StorageUnavailable
from persys.storage.s3_names import bucket_name_problem

_UID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


# What no key of a bucket may do to the bucket itself, whatever its access (a bucket policy's
# explicit Deny binds the owner too in RGW; the control plane acts through the admin API, which no
# bucket policy governs): delete it, change who may reach it (policy, ACL), or change its
# configuration (Pacific's RGW knows no s3:PutEncryptionConfiguration action: a policy naming it is
# refused). Objects stay the keys' to read (and, for a full key, to write and delete).
BUCKET_DENIED_ACTIONS = (
    "s3:DeleteBucket", "s3:PutBucketPolicy", "s3:DeleteBucketPolicy", "s3:PutBucketAcl", "s3:PutObjectAcl",
    "s3:PutBucketVersioning", "s3:PutBucketCORS", "s3:PutBucketWebsite", "s3:DeleteBucketWebsite",
    "s3:PutLifecycleConfiguration", "s3:PutReplicationConfiguration", "s3:PutBucketTagging",
    "s3:PutBucketObjectLockConfiguration", "s3:PutBucketNotification", "s3:PutBucketLogging",
    "s3:PutBucketRequestPayment",
)
# RGW's max_buckets below zero: the user (and every subuser key of it) may create no bucket.
NO_BUCKETS = -1


def bucket_policy(bucket: str) -> str:
    """The policy that keeps every key of `bucket` inside it (see BUCKET_DENIED_ACTIONS)."""
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Sid": "PersysKeysStayInTheirBucket", "Effect": "Deny", "Principal": {"AWS": ["*"]},
        "Action": list(BUCKET_DENIED_ACTIONS),
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]})


@dataclass(frozen=True)
class S3Key:
    user: str  # "uid", or "uid:name" for a restricted (subuser) key
    access_key: str
    secret_key: str = field(repr=False)


class RgwRefused(StorageError):
    """RGW answered with an error `code` (S3's or the admin API's)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class RgwNotFound(RgwRefused):
    pass


def _check_uid(uid: str, what: str = "user") -> None:
    if not isinstance(uid, str) or not _UID.fullmatch(uid):
        raise StorageError(f"{what}: {uid!r} is not a user id (lowercase letters, digits, '-', '_'; up to 63)")


def _check_bucket(name: str) -> None:
    problem = bucket_name_problem(name)
    if problem:
        raise StorageError(problem)


# What RGW answers, as the field of ours it concerns.
_FIELD_OF_CODE = {
    "InvalidBucketName": "bucket", "BucketAlreadyExists": "bucket", "BucketNotEmpty": "bucket",
    "NoSuchBucket": "bucket", "TooManyBuckets": "bucket", "NoSuchUser": "user", "UserAlreadyExists": "user",
    "InvalidArgument": "request", "InvalidQuotaSetting": "quota", "QuotaExceeded": "quota",
    "AccessDenied": "credentials", "InvalidAccessKeyId": "credentials", "SignatureDoesNotMatch": "credentials",
}


def _refusal(code: str, message: str, subject: str) -> RgwRefused:
    where = _FIELD_OF_CODE.get(code, "request")
    text = f"{where}: RGW refused {subject} ({code}{': ' + message if message else ''})"
    if code in ("NoSuchBucket", "NoSuchUser", "NoSuchKey", "NoSuchSubUser"):
        return RgwNotFound(text, code)
    return RgwRefused(text, code)


class RgwAdmin:
    def __init__(self, endpoint: str, access_key: str, secret_key: str, *, region: str = "us-east-1",
                 timeout_s: float = 30.0, verify: bool | str = True) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise StorageError(f"endpoint: {endpoint!r} is not an http(s) URL")
        if not access_key or not secret_key:
            raise StorageError("credentials: the RGW admin user's access and secret keys are required")
        self.endpoint = endpoint.rstrip("/")
        self.region = region
        self._creds = Credentials(access_key, secret_key)
        self._timeout = timeout_s
        self._verify = verify
        self._http = httpx.Client(timeout=timeout_s, verify=verify)
        self._s3: dict[str, Any] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._http.close()
        with self._lock:
            clients, self._s3 = list(self._s3.values()), {}
        for c in clients:
            c.close()

    # -- the admin API ---------------------------------------------------------------------------

    def _admin(self, method: str, resource: str, params: list[tuple[str, str]], subject: str) -> Any:
        # A flag ("quota", "key") goes bare: RGW routes on it as a sub-resource only without "=".
        query = "&".join(quote(k, safe="") + (f"={quote(v, safe='')}" if v else "")
                         for k, v in [*params, ("format", "json")])
        url = f"{self.endpoint}/admin/{resource}?{query}"
        req = AWSRequest(method=method, url=url, data=b"")
        S3SigV4Auth(self._creds, "s3", self.region).add_auth(req)
        try:
            resp = self._http.request(method, url, headers=dict(req.headers.items()))
        except httpx.HTTPError as err:
            raise StorageUnavailable(f"RGW at {self.endpoint} unreachable: {type(err).__name__}") from err
        if resp.status_code >= 400:
            try:
                code = str(resp.json().get("Code", ""))
            except ValueError:
                code = ""
            raise _refusal(code or f"HTTP {resp.status_code}", "", subject)
        return resp.json() if resp.content else None

    def user_keys(self, uid: str) -> list[S3Key]:
        """Every S3 key of the user and of its restricted keys."""
        _check_uid(uid)
        info = self._admin("GET", "user", [("uid", uid)], f"user {uid!r}")
        return [S3Key(k["user"], k["access_key"], k["secret_key"]) for k in info.get("keys", [])]

    def create_user(self, uid: str, display_name: str = "", *, max_buckets: int | None = None) -> S3Key:
        """The user with an S3 key; an existing user: its first own key (a new one if it has none)."""
        _check_uid(uid)
        params = [("uid", uid), ("display-name", display_name or uid), ("key-type", "s3"), ("generate-key", "true")]
        if max_buckets is not None:
            params.append(("max-buckets", str(int(max_buckets))))
        try:
            info = self._admin("PUT", "user", params, f"user {uid!r}")
        except RgwRefused as err:
            if err.code != "UserAlreadyExists":
                raise
            own = [k for k in self.user_keys(uid) if k.user == uid]
            return own[0] if own else self.create_key(uid)
        k = next(k for k in info["keys"] if k["user"] == uid)
        return S3Key(uid, k["access_key"], k["secret_key"])

    def delete_user(self, uid: str) -> None:
        """The user, its keys, and its buckets with their objects; gone already: nothing to do."""
        _check_uid(uid)
        try:
            self._admin("DELETE", "user", [("uid", uid), ("purge-data", "true")], f"user {uid!r}")
        except RgwNotFound:
            pass

    def create_key(self, uid: str) -> S3Key:
        """A further full-access S3 key of the user (rotation: create, hand out, delete the old)."""
        before = {k.access_key for k in self.user_keys(uid)}
        keys = self._admin("PUT", "user", [("key", ""), ("uid", uid), ("key-type", "s3"), ("generate-key", "true")],
                           f"a key of user {uid!r}")
        new = [k for k in keys if k["user"] == uid and k["access_key"] not in before]
        if not new:
            raise StorageError(f"user: RGW made no new key for {uid!r}")
        return S3Key(uid, new[0]["access_key"], new[0]["secret_key"])

    def create_read_only_key(self, uid: str, name: str) -> S3Key:
        """A key that may read the user's buckets and write nothing (an RGW subuser `uid:name` with
        read access); existing: its key."""
        return self.create_named_key(uid, name, "read")

    def create_named_key(self, uid: str, name: str, access: str) -> S3Key:
        """A key of the RGW subuser `uid:name` with `access` ("read" or "full") to the user's
        buckets; existing: its key. Named, so a retry after a crash finds the key it made."""
        _check_uid(uid)
        _check_uid(name, "key name")
        if access not in ("read", "full"):
            raise StorageError(f"access: {access!r} is neither 'read' nor 'full'")
        sub = f"{uid}:{name}"
        # RGW adds another key when asked to create a subuser that exists: look first.
        keys = [k for k in self.user_keys(uid) if k.user == sub]
        if not keys:
            self._admin("PUT", "user", [("subuser", sub), ("uid", uid), ("access", access), ("key-type", "s3"),
                                        ("generate-secret", "true"), ("gen-access-key", "true")], f"key {sub!r}")
            keys = [k for k in self.user_keys(uid) if k.user == sub]
        if not keys:
            raise StorageError(f"key name: RGW made no S3 key for {sub!r}")
        return keys[0]

    def delete_key(self, uid: str, access_key: str) -> None:
        """One S3 key (a restricted key's subuser goes with it); gone already: nothing to do."""
        _check_uid(uid)
        for k in self.user_keys(uid):
            if k.access_key != access_key:
                continue
            if ":" in k.user:
                params = [("subuser", k.user), ("uid", uid), ("purge-keys", "true")]
            else:
                params = [("key", ""), ("uid", uid), ("access-key", access_key), ("key-type", "s3")]
            try:
                self._admin("DELETE", "user", params, f"a key of user {uid!r}")
            except RgwNotFound:
                pass

    def set_bucket_quota(self, uid: str, bucket: str, *, max_size_mb: int | None = None,
                         max_objects: int | None = None) -> None:
        """A quota on one bucket of the user (None: that bound off)."""
        _check_uid(uid)
        _check_bucket(bucket)
        for name, v in (("max_size_mb", max_size_mb), ("max_objects", max_objects)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise StorageError(f"quota: {name} must be a positive integer, not {v!r}")
        # As query parameters: RGW's admin API cannot verify a signed request body (it answers
        # NotImplemented for that), and a quota needs none.
        params = [("quota", ""), ("uid", uid), ("bucket", bucket), ("enabled", "true"),
                  ("max-size-kb", str(max_size_mb * 1024 if max_size_mb else -1)),
                  ("max-objects", str(max_objects if max_objects else -1))]
        self._admin("PUT", "bucket", params, f"the quota of {bucket!r}")

    def set_max_buckets(self, uid: str, max_buckets: int) -> None:
        """How many buckets the user may own (negative: it may create none)."""
        _check_uid(uid)
        self._admin("POST", "user", [("uid", uid), ("max-buckets", str(int(max_buckets)))], f"user {uid!r}")

    def user_max_buckets(self, uid: str) -> int:
        _check_uid(uid)
        return int(self._admin("GET", "user", [("uid", uid)], f"user {uid!r}").get("max_buckets", 0))

    def remove_bucket(self, bucket: str, *, purge_objects: bool) -> None:
        """The bucket through the admin API (no bucket policy applies to it); with objects and
        not `purge_objects`: refused (BucketNotEmpty). Gone already: nothing to do."""
        _check_bucket(bucket)
        params = [("bucket", bucket)] + ([("purge-objects", "true")] if purge_objects else [])
        try:
            self._admin("DELETE", "bucket", params, f"bucket {bucket!r}")
        except RgwNotFound:
            pass

    def bucket_info(self, bucket: str) -> dict[str, Any]:
        _check_bucket(bucket)
        out = self._admin("GET", "bucket", [("bucket", bucket), ("stats", "true")], f"bucket {bucket!r}")
        return dict(out)

    # -- buckets through S3 ----------------------------------------------------------------------

    def s3(self, key: S3Key) -> Any:
        """A boto3 S3 client acting with `key` (path-style addressing, bounded timeouts)."""
        with self._lock:
            client = self._s3.get(key.access_key)
            if client is None:
                cfg = Config(s3={"addressing_style": "path"}, connect_timeout=self._timeout,
                             read_timeout=self._timeout, retries={"max_attempts": 2}, signature_version="s3v4")
                client = boto3.session.Session().client(
                    "s3", endpoint_url=self.endpoint, region_name=self.region, aws_access_key_id=key.access_key,
                    aws_secret_access_key=key.secret_key, config=cfg, verify=self._verify)
                self._s3[key.access_key] = client
            return client

    def _s3_call(self, subject: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except ClientError as err:
            e = err.response.get("Error", {})
            raise _refusal(str(e.get("Code", "")), str(e.get("Message", "")), subject) from err
        except BotoCoreError as err:
            raise StorageUnavailable(f"RGW at {self.endpoint} unreachable: {type(err).__name__}") from err

    def create_bucket(self, key: S3Key, bucket: str) -> None:
        """Owned by `key`'s user; one it already owns: nothing to do."""
        _check_bucket(bucket)
        try:
            self._s3_call(f"bucket {bucket!r}", self.s3(key).create_bucket, Bucket=bucket)
        except RgwRefused as err:
            if err.code != "BucketAlreadyOwnedByYou":
                raise

    def delete_bucket(self, key: S3Key, bucket: str, *, purge: bool = False) -> None:
        """Refused while it holds objects unless `purge`; gone already: nothing to do."""
        _check_bucket(bucket)
        client = self.s3(key)
        try:
            if purge:
                self._purge(client, bucket)
            self._s3_call(f"bucket {bucket!r}", client.delete_bucket, Bucket=bucket)
        except RgwNotFound:
            pass

    def _purge(self, client: Any, bucket: str) -> None:
        while True:
            page = self._s3_call(f"bucket {bucket!r}", client.list_objects_v2, Bucket=bucket, MaxKeys=1000)
            objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if not objs:
                return
            self._s3_call(f"bucket {bucket!r}", client.delete_objects, Bucket=bucket,
                          Delete={"Objects": objs, "Quiet": True})

    def confine_keys(self, owner: S3Key, bucket: str) -> None:
        """Keep every key of the owner inside `bucket`: the bucket's policy (no key may delete it
        or open it to others) and no further bucket for the owner or its keys. Idempotent."""
        _check_bucket(bucket)
        self._s3_call(f"the policy of bucket {bucket!r}", self.s3(owner).put_bucket_policy, Bucket=bucket,
                      Policy=bucket_policy(bucket))
        self.set_max_buckets(owner.user, NO_BUCKETS)

    def bucket_policy(self, key: S3Key, bucket: str) -> str:
        """The bucket's policy as RGW keeps it ("" when it has none)."""
        try:
            out = self._s3_call(f"the policy of bucket {bucket!r}", self.s3(key).get_bucket_policy, Bucket=bucket)
        except RgwRefused as err:
            if err.code == "NoSuchBucketPolicy":
                return ""
            raise
        return str(out.get("Policy", ""))

    def list_buckets(self, key: S3Key) -> list[str]:
        out = self._s3_call("the bucket list", self.s3(key).list_buckets)
        return sorted(str(b["Name"]) for b in out.get("Buckets", []))
