"""Pure: `kind: Bucket` names and quotas (manifest_cases.yaml), and the bucket rules: which
workloads reference a bucket's keys, key ids, RGW's refusals named as our fields, a key's secret."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model.bucket import Bucket, BucketKey, KeyRole, key_secret_name, rgw_user_of
from persys.model.kinds import parse_all, validate_bucket
from persys.model.manifest import ManifestError
from persys.model.secret_refs import SECRET_NAME_RE
from persys.model.workload import Workload, WorkloadManifest
from persys.scheduler.rules import buckets as rules
from tests.cases import load

CASES: list[dict[str, Any]] = load(__file__, "manifest_cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_manifest(case: dict[str, Any]) -> None:
    doc = {"apiVersion": "persys.dev/v1", "kind": "Bucket", **case["doc"]}
    if case.get("ok"):
        m = validate_bucket(doc)
        assert m.metadata.name == doc["metadata"]["name"]
        # Whatever name passes makes a valid secret name and RGW user id for its keys.
        assert SECRET_NAME_RE.fullmatch(key_secret_name(m.metadata.name, "abc123"))
        assert len(rgw_user_of(m.metadata.name)) <= 63
        return
    with pytest.raises(ManifestError) as err:
        validate_bucket(doc)
    hits = [p for p in err.value.problems if p.startswith(case["error"] + ":")]
    assert hits, err.value.problems
    assert case["says"] in hits[0]


def test_apply_files_carry_buckets() -> None:
    docs = parse_all("apiVersion: persys.dev/v1\nkind: Bucket\nmetadata: {name: photos}\n"
                     "spec: {quota: {maxObjects: 5}}\n")
    assert [b.metadata.name for b in docs.buckets] == ["photos"] and not docs.workloads


def _workload(name: str, secrets: list[str], deleting: bool = False) -> Workload:
    m = WorkloadManifest.model_validate({
        "apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
        "spec": {"type": "process", "process": {"command": ["true"]},
                 "secrets": {"env": [{"name": f"V{i}", "secretRef": {"name": s, "key": "AWS_ACCESS_KEY_ID"}}
                                     for i, s in enumerate(secrets)]}}})
    return Workload(id=name, name=name, spec=m.spec, revision="r", created_at=0.0, updated_at=0.0, deleting=deleting)


def test_users_of_a_bucket_and_of_one_key() -> None:
    b = Bucket(name="photos", owner=rgw_user_of("photos"),
               keys=[BucketKey(id="aaaaaa", role=KeyRole.ADMIN), BucketKey(id="bbbbbb", role=KeyRole.READ_ONLY)])
    other = Bucket(name="photos-old", owner=rgw_user_of("photos-old"), keys=[BucketKey(id="cccccc", role="admin")])
    ws = [_workload("w1", ["bucket-photos-aaaaaa"]), _workload("w2", ["bucket-photos-old-cccccc", "db"]),
          _workload("w3", ["bucket-photos-bbbbbb"], deleting=True), _workload("w4", [])]
    assert rules.users_of(rules.secret_names(b), ws) == ["w1", "w3"]  # deleting ones still hold it
    assert rules.users_of(rules.secret_names(b, [b.keys[0]]), ws) == ["w1"]
    assert rules.users_of(rules.secret_names(other), ws) == ["w2"]  # a longer bucket name is not a prefix match
    assert rules.shown([f"w{i}" for i in range(7)]) == "w0, w1, w2, w3, w4 and 2 more"


def test_key_ids_roles_and_secret_data() -> None:
    taken = {rules.new_key_id(()) for _ in range(50)}
    assert all(rules.KEY_ID_CHARS.__contains__(c) for k in taken for c in k) and {len(k) for k in taken} == {6}
    assert rules.new_key_id(taken) not in taken
    assert (rules.rgw_access(KeyRole.READ_ONLY), rules.rgw_access(KeyRole.ADMIN)) == ("read", "full")
    data = rules.key_secret_data("photos", "http://rgw:7480", "AK", "SK")
    assert sorted(data) == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "S3_BUCKET", "S3_ENDPOINT"]
    assert data["S3_BUCKET"] == b"photos" and data["AWS_SECRET_ACCESS_KEY"] == b"SK"


@pytest.mark.parametrize(("rgw", "ours"), [
    ("bucket: RGW refused bucket 'x' (BucketAlreadyExists)",
     "metadata.name: RGW refused bucket 'x' (BucketAlreadyExists)"),
    ("quota: RGW refused the quota (InvalidArgument)", "spec.quota: RGW refused the quota (InvalidArgument)"),
    ("credentials: RGW refused user 'u' (AccessDenied)", "storage.rgw.accessKey: RGW refused user 'u' (AccessDenied)"),
    ("no field here", "no field here"),
])
def test_rgw_refusals_name_our_fields(rgw: str, ours: str) -> None:
    assert rules.our_field(rgw) == ours


# The bucket watch: (phase, confined, the owner RGW names: None = no such bucket) -> action.
WATCH_CASES = [
    ("Ready", True, "persys-bucket-b", "none"),
    ("Ready", False, "persys-bucket-b", "confine"),  # made before keys were confined
    ("Ready", True, None, "lost"),  # deleted in RGW behind our back
    ("Ready", False, None, "lost"),
    ("Ready", True, "someone-else", "lost"),  # the name now another user's bucket
    ("Creating", False, None, "none"),  # on their way: the creation or deletion decides
    ("Deleting", True, None, "none"),
    ("Lost", True, None, "none"),  # said once
]


@pytest.mark.parametrize(("phase", "confined", "owner", "action"), WATCH_CASES)
def test_watch_action(phase: str, confined: bool, owner: str | None, action: str) -> None:
    b = Bucket(name="b", owner=rgw_user_of("b"), phase=phase, confined=confined)  # type: ignore[arg-type]
    assert rules.watch_action(b, owner) == action
