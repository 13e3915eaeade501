"""`kind: Bucket`: an S3 bucket on Ceph RGW as a user declares it, and the binding the scheduler
keeps (`/persys/buckets/<name>`). The bucket and its objects stay in RGW; key values stay in the
secret store; the binding names them only.

    apiVersion: persys.dev/v1
    kind: Bucket
    metadata: {name: photos}
    spec:
      quota: {maxSizeMb: 1024, maxObjects: 100000}   # optional, each bound optional

Each key of the bucket is a secret named `bucket-<bucket>-<keyid>` (keys AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, S3_ENDPOINT, S3_BUCKET) that a workload references through `spec.secrets`.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, StrictInt, StrictStr, field_validator

from persys.model.base import Model
from persys.model.s3_names import bucket_name_problem

# A key's secret, `bucket-<bucket>-<keyid>`, must be a DNS label (63 characters): with the 7 of
# "bucket-", a '-' and a 6-character key id, a bucket name keeps 49; and a '.' has no place in it.
MAX_BUCKET_NAME = 49
KEY_ID_RE = re.compile(r"^[a-z0-9]{6}$")
MAX_KEYS_PER_BUCKET = 32
MAX_QUOTA_MB = 1 << 40  # an exabyte: RGW takes kilobytes in a signed 64-bit field
MAX_QUOTA_OBJECTS = 1 << 53
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "S3_ENDPOINT", "S3_BUCKET")


def bucket_name_rule(name: object) -> str:
    """Why `name` cannot name a Persys bucket ("" when it can): S3's rules first, then ours."""
    problem = bucket_name_problem(name)
    if problem:
        return problem.removeprefix("bucket: ")
    assert isinstance(name, str)
    if len(name) > MAX_BUCKET_NAME:
        return (f"{name!r} is longer than {MAX_BUCKET_NAME} characters (its keys' secrets are named "
                "bucket-<name>-<keyid>, a DNS label)")
    if "." in name:
        return f"{name!r} holds a '.' (its keys' secrets are named bucket-<name>-<keyid>, a DNS label)"
    return ""


def key_secret_name(bucket: str, key_id: str) -> str:
    return f"bucket-{bucket}-{key_id}"


def rgw_user_of(bucket: str) -> str:
    """The RGW user that owns the bucket (one per bucket: its keys reach that bucket only)."""
    return f"persys-bucket-{bucket}"


class KeyRole(StrEnum):
    READ_ONLY = "read-only"  # list and get objects
    ADMIN = "admin"  # read, write and delete objects


class BucketQuota(Model):
    max_size_mb: Annotated[StrictInt, Field(ge=1, le=MAX_QUOTA_MB)] | None = None
    max_objects: Annotated[StrictInt, Field(ge=1, le=MAX_QUOTA_OBJECTS)] | None = None


class BucketSpec(Model):
    quota: BucketQuota = Field(default_factory=BucketQuota)


class BucketMetadata(Model):
    name: StrictStr
    labels: dict[StrictStr, StrictStr] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _bucket_name(cls, v: str) -> str:
        problem = bucket_name_rule(v)
        if problem:
            raise ValueError(problem)
        return v


class BucketManifest(Model):
    api_version: Literal["persys.dev/v1"]
    kind: Literal["Bucket"]
    metadata: BucketMetadata
    spec: BucketSpec = Field(default_factory=BucketSpec)


class BucketPhase(StrEnum):
    CREATING = "Creating"  # the binding is written; RGW's user, bucket and quota on their way
    READY = "Ready"
    DELETING = "Deleting"  # keys, secrets, bucket and user on their way out; then the binding goes
    LOST = "Lost"  # RGW no longer has the bucket (deleted outside Persys): only a deletion is taken


class KeyPhase(StrEnum):
    CREATING = "Creating"  # recorded before RGW makes it, so a crash leaves something to clean
    READY = "Ready"


class BucketKey(Model):
    """One key of the bucket: its id, role, the access key id (not secret) and the secret's name."""

    id: StrictStr
    role: KeyRole
    phase: KeyPhase = KeyPhase.CREATING
    access_key_id: StrictStr = ""
    secret: StrictStr = ""
    created_at: float = 0.0


class Bucket(Model):
    """The binding: never a secret value."""

    name: StrictStr
    owner: StrictStr  # the RGW user
    quota: BucketQuota = Field(default_factory=BucketQuota)
    labels: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    keys: list[BucketKey] = Field(default_factory=list)
    phase: BucketPhase = BucketPhase.CREATING
    reason: StrictStr = ""
    purge: bool = False  # the deletion asked for takes the objects too
    # Its keys are kept inside it (bucket policy, no further buckets for its RGW user). False on a
    # binding made before that: the bucket watch confines it on its next pass.
    confined: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0

    @classmethod
    def from_manifest(cls, m: BucketManifest, now: float) -> Bucket:
        return cls(name=m.metadata.name, owner=rgw_user_of(m.metadata.name), quota=m.spec.quota,
                   labels=dict(m.metadata.labels), created_at=now, updated_at=now)

    def key(self, key_id: str) -> BucketKey | None:
        return next((k for k in self.keys if k.id == key_id), None)
