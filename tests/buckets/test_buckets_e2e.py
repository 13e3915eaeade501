"""Buckets end to end on the session's real Ceph RGW, with real processes (a scheduler whose
--storage file has an rgw section, an agent running process workloads, a gateway, persysctl):

- bucket create -> key create (admin and read-only) -> a process workload referencing both keys'
  secrets puts and gets an object with the delivered env (boto3 in the agent venv's python), and
  its read-only key is refused a put;
- bucket delete refused while the workload references a key, refused while it holds objects,
  then deleted with purge after the workload -> RGW holds neither the bucket nor its user;
- no key value in any event, log line, status, answer, the state store or the agent's database;
- bad input (a name RGW refuses, names and quotas the model refuses, an unknown role): a 4xx
  naming the field, nothing written, nothing left in RGW.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from persys.model.bucket import rgw_user_of
from persys.storage.base import StorageError
from persys.storage.rgw import RgwAdmin, RgwNotFound
from tests.ceph_cluster import CephCluster
from tests.e2e.harness import ctl
from tests.gateway.cluster import GatewayCluster, start_cluster

pytestmark = pytest.mark.e2e

# The workload: put and get an object with the admin key (AWS_* env), try a put with the read-only
# key (RO_* env), and write what happened into its work directory; then wait.
SCRIPT = r"""
import json, os, boto3
from botocore.config import Config
from botocore.exceptions import ClientError
def s3(access, secret):
    return boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                        aws_access_key_id=access, aws_secret_access_key=secret,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))
bucket = os.environ["S3_BUCKET"]
admin = s3(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
admin.put_object(Bucket=bucket, Key="hello.txt", Body=b"hello from a workload")
got = admin.get_object(Bucket=bucket, Key="hello.txt")["Body"].read().decode()
try:
    s3(os.environ["RO_ACCESS_KEY_ID"], os.environ["RO_SECRET_ACCESS_KEY"]).put_object(
        Bucket=bucket, Key="nope", Body=b"x")
    ro = "accepted"
except ClientError as err:
    ro = err.response["Error"]["Code"]
with open("proof.tmp", "w") as f:
    json.dump({"got": got, "readOnlyPut": ro}, f)
os.rename("proof.tmp", "proof")
"""


def workload(name: str, admin_secret: str, ro_secret: str) -> dict[str, Any]:
    # A whole core: importing boto3 takes about half a CPU second, 50 s under a 10-millicore quota.
    def env(var: str, secret: str, key: str) -> dict[str, Any]:
        return {"name": var, "secretRef": {"name": secret, "key": key}}

    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"type": "process", "restartPolicy": "Never", "resources": {"cpuMillicores": 1000, "memoryMb": 256},
                     "process": {"command": [sys.executable, "-c", SCRIPT + "\nimport time; time.sleep(600)\n"]},
                     "secrets": {"env": [
                         *(env(k, admin_secret, k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                             "S3_ENDPOINT", "S3_BUCKET")),
                         env("RO_ACCESS_KEY_ID", ro_secret, "AWS_ACCESS_KEY_ID"),
                         env("RO_SECRET_ACCESS_KEY", ro_secret, "AWS_SECRET_ACCESS_KEY")]}}}


def wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def rgw(ceph_cluster: CephCluster) -> Iterator[RgwAdmin]:
    admin = RgwAdmin(ceph_cluster.rgw_endpoint, ceph_cluster.rgw_admin_access_key, ceph_cluster.rgw_admin_secret_key)
    yield admin
    admin.close()


@pytest.fixture(scope="module")
def cluster(ceph_cluster: CephCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    tmp = tmp_path_factory.mktemp("buckets")
    key_file = tmp / "rgw-admin.key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # root-only from the start
    with os.fdopen(fd, "w") as f:
        f.write(ceph_cluster.rgw_admin_secret_key + "\n")
    storage = tmp / "storage.yaml"
    storage.write_text(json.dumps({"rgw": {"endpoint": ceph_cluster.rgw_endpoint,
                                           "accessKey": ceph_cluster.rgw_admin_access_key,
                                           "secretKeyFile": str(key_file)}}))
    # The workload runs the agent venv's python (boto3); that interpreter may live under /root
    # (pyenv), which the default workload user cannot reach: processes run as root here.
    c = start_cluster(tmp, with_agent=True, scheduler_args=("--storage", str(storage), "--secrets",
                                                            f"builtin:{tmp / 'secrets.key'}"),
                      agent_args=("--workload-user", "root"))
    try:
        yield c
    finally:
        with c.client() as http:  # workloads outlive the test otherwise; the agent removes them
            for w in http.get("/v1/workloads").json():
                http.delete(f"/v1/workloads/{w['name']}")
            wait_for("workloads gone", lambda: not http.get("/v1/workloads").json(), 30)
            for b in http.get("/v1/buckets").json():
                http.delete(f"/v1/buckets/{b['name']}", params={"purge": "true"})
        c.stop()


def _gone_from_rgw(rgw: RgwAdmin, bucket: str) -> None:
    with pytest.raises(RgwNotFound):
        rgw.bucket_info(bucket)
    with pytest.raises(RgwNotFound):
        rgw.user_keys(rgw_user_of(bucket))


def _places(c: GatewayCluster, http: httpx.Client, bucket: str) -> dict[str, bytes]:
    """Every place a key's value must never be."""
    places = {p.name: p.read_bytes() for p in [*c.tmp.glob("state.db*"), *(c.tmp / "agent").glob("agent.db*"),
                                               *c.tmp.glob("*.log")]}
    for path in ("/v1/events?limit=1000", "/v1/audit?limit=1000", "/v1/buckets", f"/v1/buckets/{bucket}",
                 f"/v1/buckets/{bucket}/keys", "/v1/secrets", "/v1/workloads", "/v1/workloads/s3-user"):
        places[path] = http.get(path).content
    return places


def test_bucket_keys_workload_and_deletion(cluster: GatewayCluster, rgw: RgwAdmin) -> None:
    c = cluster
    env = c.ctl_env()
    bucket = f"photos-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    created = ctl("bucket", "create", bucket, "--max-size-mb", "64", "--max-objects", "100", env=env)
    create_s = time.monotonic() - t0
    assert f"bucket/{bucket} created" in created.stdout
    quota = rgw.bucket_info(bucket)["bucket_quota"]
    assert quota["enabled"] and quota["max_objects"] == 100 and quota["max_size"] == 64 << 20
    assert f"bucket/{bucket} configured" in ctl("bucket", "create", bucket, "--max-size-mb", "64",
                                                "--max-objects", "100", env=env).stdout  # idempotent

    t0 = time.monotonic()
    admin_key = json.loads(ctl("bucket", "key", "create", bucket, "--role", "admin", "-o", "json", env=env).stdout)
    key_s = time.monotonic() - t0
    ro_key = json.loads(ctl("bucket", "key", "create", bucket, "--role", "read-only", "-o", "json", env=env).stdout)
    for k, role in ((admin_key, "admin"), (ro_key, "read-only")):
        assert k["role"] == role and k["secret"] == f"bucket-{bucket}-{k['id']}" and k["accessKeyId"]
        assert set(k) == {"id", "role", "phase", "accessKeyId", "secret", "createdAt"}  # never the secret key
    values = {k.secret_key for k in rgw.user_keys(rgw_user_of(bucket))}
    assert len(values) == 3  # the owner's own key, the admin and the read-only key
    # kubectl's verbs work on buckets too; describe names each key's secret, never its value.
    assert json.loads(ctl("get", "buckets", bucket, "-o", "json", env=env).stdout)["name"] == bucket
    described = ctl("describe", "bucket", bucket, env=env).stdout
    assert admin_key["secret"] in described and ro_key["accessKeyId"] in described
    assert "64 MiB, 100 objects" in described
    assert not any(v in described for v in values)

    with c.client() as http:
        secret = http.get(f"/v1/secrets/{admin_key['secret']}").json()
        assert sorted(secret["keys"]) == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "S3_BUCKET", "S3_ENDPOINT"]
        r = http.post("/v1/workloads", json=workload("s3-user", admin_key["secret"], ro_key["secret"]))
        assert r.status_code == 201, r.text
        proof_file = c.tmp / "agent" / "runtimes" / "process" / "s3-user" / "work" / "proof"
        try:
            proof = json.loads(wait_for("the workload's proof",
                                        lambda: proof_file.exists() and proof_file.read_text(), 90))
        except AssertionError:
            logs = {str(p): p.read_text(errors="replace")[-2000:]
                    for p in proof_file.parent.parent.rglob("*") if p.is_file() and p.stat().st_size < 1 << 20}
            raise AssertionError(f"{http.get('/v1/workloads/s3-user').text}\n{logs}") from None
        assert proof == {"got": "hello from a workload", "readOnlyPut": "AccessDenied"}

        # persysctl object, straight to RGW with a key's values in the environment (as a workload has them).
        by_id = {k.access_key: k.secret_key for k in rgw.user_keys(rgw_user_of(bucket))}
        s3_env = {"S3_ENDPOINT": rgw.endpoint, "AWS_ACCESS_KEY_ID": admin_key["accessKeyId"],
                  "AWS_SECRET_ACCESS_KEY": by_id[admin_key["accessKeyId"]]}
        assert "hello.txt" in ctl("object", "ls", bucket, env=s3_env).stdout
        assert ctl("object", "get", bucket, "hello.txt", env=s3_env).stdout == "hello from a workload"
        upload = c.tmp / "upload.txt"
        upload.write_text("from persysctl")
        ro_env = {**s3_env, "AWS_ACCESS_KEY_ID": ro_key["accessKeyId"],
                  "AWS_SECRET_ACCESS_KEY": by_id[ro_key["accessKeyId"]]}
        p = ctl("object", "put", bucket, "up.txt", str(upload), env=ro_env, check=False)
        assert p.returncode != 0 and "AccessDenied" in p.stdout + p.stderr
        assert "uploaded" in ctl("object", "put", bucket, "up.txt", str(upload), env=s3_env).stdout

        refused = http.delete(f"/v1/buckets/{bucket}", params={"purge": "true"})
        assert refused.status_code == 409 and "s3-user" in refused.json()["error"], refused.text
        key_refused = http.delete(f"/v1/buckets/{bucket}/keys/{ro_key['id']}")
        assert key_refused.status_code == 409 and "s3-user" in key_refused.json()["error"]
        got = http.get(f"/v1/buckets/{bucket}").json()
        assert got["usedBy"] == ["s3-user"] and got["usage"]["objects"] == 2 and got["phase"] == "Ready"

        places = _places(c, http, bucket)
        leaked = [name for name, blob in places.items() if any(v.encode() in blob for v in values)]
        assert leaked == [], f"a key's secret value found in {leaked}"

        assert http.delete("/v1/workloads/s3-user").status_code == 200
        wait_for("the workload gone", lambda: http.get("/v1/workloads/s3-user").status_code == 404, 60)
        full = http.delete(f"/v1/buckets/{bucket}")
        assert full.status_code == 409 and "holds objects" in full.json()["error"], full.text
        assert http.get(f"/v1/buckets/{bucket}").json()["phase"] == "Ready"  # nothing was taken away
        assert len(rgw.user_keys(rgw_user_of(bucket))) == 3
        # A key goes with its RGW key and its secret.
        assert http.delete(f"/v1/buckets/{bucket}/keys/{ro_key['id']}").json() == {"deleted": True,
                                                                                  "alreadyGone": False}
        assert http.get(f"/v1/secrets/{ro_key['secret']}").status_code == 404
        assert ro_key["accessKeyId"] not in {k.access_key for k in rgw.user_keys(rgw_user_of(bucket))}

        t0 = time.monotonic()
        assert f"bucket/{bucket} deleted" in ctl("bucket", "delete", bucket, "--purge", env=env).stdout
        delete_s = time.monotonic() - t0
        assert http.get(f"/v1/buckets/{bucket}").status_code == 404
        assert http.get(f"/v1/secrets/{admin_key['secret']}").status_code == 404
        assert "already gone" in ctl("bucket", "delete", bucket, env=env).stdout
        events = [e for e in http.get("/v1/events?limit=1000").json()
                  if e.get("subject") == f"bucket/{bucket}"]
        assert {e["kind"] for e in events} >= {"BucketCreated", "BucketKeyCreated", "BucketKeyDeleted",
                                               "BucketDeleted"}
    _gone_from_rgw(rgw, bucket)
    print(f"\nbucket create {create_s:.2f} s, key create {key_s:.2f} s, delete (purge) {delete_s:.2f} s "
          "(persysctl through the gateway)")


def test_bad_input_names_the_field_and_leaves_nothing(cluster: GatewayCluster, rgw: RgwAdmin,
                                                      ceph_cluster: CephCluster) -> None:
    # A bucket RGW refuses: the name is taken by a user outside Persys.
    taken = f"taken-{uuid.uuid4().hex[:6]}"
    outsider = rgw.create_user(f"outsider-{uuid.uuid4().hex[:6]}")
    rgw.create_bucket(outsider, taken)
    try:
        with cluster.client() as http:
            def create(name: Any, quota: dict[str, Any] | None = None) -> httpx.Response:
                return http.post("/v1/buckets", json={"apiVersion": "persys.dev/v1", "kind": "Bucket",
                                                      "metadata": {"name": name}, "spec": {"quota": quota or {}}})

            r = create(taken)
            assert r.status_code == 409 and r.json()["error"].startswith("metadata.name: ") \
                and "BucketAlreadyExists" in r.json()["error"], r.text
            assert http.get(f"/v1/buckets/{taken}").status_code == 404
            with pytest.raises(RgwNotFound):
                rgw.user_keys(rgw_user_of(taken))  # the user made for it was removed again
            assert rgw.bucket_info(taken)["owner"] == outsider.user  # and theirs untouched

            for name, quota, field in (("Bad_Name", None, "metadata.name"), ("10.0.0.1", None, "metadata.name"),
                                       ("a..b", None, "metadata.name"), ("quota-zero", {"maxSizeMb": 0},
                                                                           "spec.quota.maxSizeMb"),
                                       ("quota-neg", {"maxObjects": -1}, "spec.quota.maxObjects")):
                r = create(name, quota)
                assert r.status_code == 400 and any(p.startswith(field + ":") for p in r.json()["problems"]), r.text
                with pytest.raises((RgwNotFound, StorageError)):
                    rgw.user_keys(rgw_user_of(name.lower().replace("_", "-").replace(".", "-")))

            ok = f"roles-{uuid.uuid4().hex[:6]}"
            manifest = cluster.tmp / "bucket.yaml"
            manifest.write_text(f"apiVersion: persys.dev/v1\nkind: Bucket\nmetadata: {{name: {ok}}}\n"
                                "spec: {quota: {maxObjects: 3}}\n")
            assert f"bucket/{ok} created" in ctl("apply", "-f", str(manifest), env=cluster.ctl_env()).stdout
            assert http.get(f"/v1/buckets/{ok}").json()["quota"] == {"maxObjects": 3}
            r = http.post(f"/v1/buckets/{ok}/keys", json={"role": "owner"})
            assert r.status_code == 422 and "role" in r.text
            assert http.get(f"/v1/buckets/{ok}/keys").json() == []
            assert http.get(f"/v1/buckets/{'x' * 50}").status_code == 400  # the path names the field too
            assert http.delete(f"/v1/buckets/{ok}").json() == {"deleted": True, "alreadyGone": False}
            _gone_from_rgw(rgw, ok)
            assert http.get("/v1/buckets").json() == []
        p = ctl("bucket", "key", "create", "whatever", "--role", "owner", env=cluster.ctl_env(), check=False)
        assert p.returncode != 0 and "role" in (p.stdout + p.stderr)
    finally:
        rgw.delete_user(outsider.user)
