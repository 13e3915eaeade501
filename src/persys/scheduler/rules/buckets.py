"""Pure decisions about buckets: which workloads reference a bucket's keys (their secrets), why a
deletion is refused, a new key's id, what RGW's refusals mean in our fields, and what a key's
secret holds."""

from __future__ import annotations

import secrets
import string
from collections.abc import Iterable
from enum import StrEnum

from persys.model.bucket import Bucket, BucketKey, BucketPhase, KeyRole, key_secret_name
from persys.model.workload import Workload

KEY_ID_CHARS = string.ascii_lowercase + string.digits
# RGW's field (persys.storage.rgw names it first in its message) as the field of ours it concerns.
OUR_FIELD = {"bucket": "metadata.name", "quota": "spec.quota", "user": "metadata.name",
             "key name": "keyId", "credentials": "storage.rgw.accessKey", "request": "request"}
# RGW codes that say the request can never succeed as it is (INVALID_ARGUMENT); the rest say
# the state forbids it now (FAILED_PRECONDITION).
INVALID_CODES = frozenset({"InvalidBucketName", "InvalidArgument", "InvalidQuotaSetting"})


def secret_names(bucket: Bucket, keys: Iterable[BucketKey] | None = None) -> set[str]:
    return {key_secret_name(bucket.name, k.id) for k in (bucket.keys if keys is None else keys)}


def users_of(names: set[str], workloads: Iterable[Workload]) -> list[str]:
    """Workloads (deleting ones too: their instances may still hold the key) that reference one
    of the secrets `names`; sorted."""
    return sorted(w.id for w in workloads
                  if w.spec.secrets is not None and names & set(w.spec.secrets.names()))


def shown(ids: list[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def new_key_id(taken: Iterable[str]) -> str:
    used = set(taken)
    while True:
        kid = "".join(secrets.choice(KEY_ID_CHARS) for _ in range(6))
        if kid not in used:
            return kid


def rgw_access(role: KeyRole) -> str:
    """The RGW subuser access a key role gets: read-only lists and reads; admin also writes and
    deletes objects (never the bucket or its quota: those stay the control plane's)."""
    return "read" if role is KeyRole.READ_ONLY else "full"


def key_secret_data(bucket: str, endpoint: str, access_key: str, secret_key: str) -> dict[str, bytes]:
    return {"AWS_ACCESS_KEY_ID": access_key.encode(), "AWS_SECRET_ACCESS_KEY": secret_key.encode(),
            "S3_ENDPOINT": endpoint.encode(), "S3_BUCKET": bucket.encode()}


def our_field(rgw_message: str) -> str:
    """The message of an RGW refusal with its leading field ("bucket: ...") named as ours."""
    head, sep, rest = rgw_message.partition(": ")
    return f"{OUR_FIELD.get(head, head)}: {rest}" if sep else rgw_message


class WatchAction(StrEnum):
    NONE = "none"
    LOST = "lost"  # RGW has no such bucket of ours: show it, do not pretend it is Ready
    CONFINE = "confine"  # made before keys were confined to their bucket: confine them now


def watch_action(b: Bucket, rgw_owner: str | None) -> WatchAction:
    """What the bucket watch does with a binding, given the owner RGW names for its bucket (None:
    RGW has no such bucket). Only Ready bindings are judged: the others are on their way."""
    if b.phase != BucketPhase.READY:
        return WatchAction.NONE
    if rgw_owner != b.owner:
        return WatchAction.LOST
    return WatchAction.NONE if b.confined else WatchAction.CONFINE
