"""The role matrix through a real cluster (scheduler and gateway processes, mTLS): every REST
route and every client RPC called as admin, operator, viewer, a user in no group, a node, the
gateway itself and (REST) nobody at all; refused exactly where role_matrix.yaml says, with 401 /
403 (UNAUTHENTICATED / PERMISSION_DENIED) naming the verb and resource. Requests are chosen so
that an allowed one changes nothing lasting (dry runs, missing objects, invalid backups). Then
the issue's probes: a node certificate cannot apply, back up or restore, and nothing is written."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from google.protobuf import message_factory

from persys.security import peer_names
from persys.security.grpc_tls import secure_channel
from persys.security.permissions import REST_RULES, RPC_RULES
from persys.security.pki import ClusterCA, TLSFiles
from tests.e2e.harness import ctl, eventually
from tests.gateway.cluster import GatewayCluster, start_cluster
from tests.security.role_certs import role_identities
from tests.security.scheduler_methods import scheduler_methods

pytestmark = pytest.mark.e2e

MATRIX: dict[str, list[str]] = yaml.safe_load(
    (Path(__file__).parents[1] / "security" / "role_matrix.yaml").read_text())
DENIED = {401, 403}
MANIFEST = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "matrix-w"},
            "spec": {"type": "process", "resources": {"cpuMillicores": 10, "memoryMb": 8},
                     "process": {"command": ["sleep", "3600"]}}}
# One request per route; "ghost" objects do not exist, so an allowed call answers 404/409/400.
REQUESTS: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("GET", "/v1/health"): ("/v1/health", {}),
    ("GET", "/metrics"): ("/metrics", {}),
    ("POST", "/v1/workloads"): ("/v1/workloads?dryRun=true", {"json": MANIFEST}),
    ("POST", "/v1/workloads:batch"): ("/v1/workloads:batch", {"content": b"not a list"}),
    ("POST", "/v1/plan"): ("/v1/plan", {"json": MANIFEST}),
    ("GET", "/v1/workloads/{workload_id}/explain"): ("/v1/workloads/ghost/explain", {}),
    ("POST", "/v1/plan/operation"): ("/v1/plan/operation", {"json": {"kind": "lose-label", "label": "zone=none"}}),
    ("GET", "/v1/workloads/{workload_id}/whatif"): ("/v1/workloads/ghost/whatif", {}),
    ("GET", "/v1/workloads"): ("/v1/workloads?limit=5", {}),
    ("GET", "/v1/workloads/{workload_id}"): ("/v1/workloads/ghost", {}),
    ("DELETE", "/v1/workloads/{workload_id}"): ("/v1/workloads/ghost", {}),
    ("GET", "/v1/workloads/{workload_id}/revisions"): ("/v1/workloads/ghost/revisions", {}),
    ("POST", "/v1/workloads/{workload_id}/rollback"): ("/v1/workloads/ghost/rollback", {"json": {"generation": 1}}),
    ("POST", "/v1/workloads/{workload_id}/{action}"): ("/v1/workloads/ghost/restart", {}),
    ("POST", "/v1/workloads/{workload_id}/instances/{instance}/move"): ("/v1/workloads/ghost/instances/0/move", {}),
    ("GET", "/v1/workloads/{workload_id}/logs"): ("/v1/workloads/ghost/logs", {}),
    ("POST", "/v1/workloads/{workload_id}/exec"): ("/v1/workloads/ghost/exec", {"json": {"command": ["true"]}}),
    ("GET", "/v1/workloads/{workload_id}/files"): ("/v1/workloads/ghost/files?path=/etc/hostname", {}),
    ("PUT", "/v1/workloads/{workload_id}/files"): ("/v1/workloads/ghost/files?path=/tmp", {"content": b"x"}),
    ("GET", "/v1/workloads/{workload_id}/console"): ("/v1/workloads/ghost/console", {}),
    ("GET", "/v1/workloads/{workload_id}/terminal"): ("/v1/workloads/ghost/terminal?command=sh", {}),
    ("POST", "/v1/nodes/{node_id}/images"): ("/v1/nodes/ghost/images?kind=docker", {"content": b"x"}),
    ("GET", "/v1/nodes/{node_id}/images"): ("/v1/nodes/ghost/images", {}),
    ("DELETE", "/v1/nodes/{node_id}/images"): ("/v1/nodes/ghost/images?kind=docker&name=busybox", {}),
    ("GET", "/v1/nodes"): ("/v1/nodes?limit=5", {}),
    ("GET", "/v1/nodes/{node_id}"): ("/v1/nodes/ghost", {}),
    ("DELETE", "/v1/nodes/{node_id}"): ("/v1/nodes/ghost", {}),
    ("POST", "/v1/nodes/{node_id}/cordon"): ("/v1/nodes/ghost/cordon", {}),
    ("POST", "/v1/nodes/{node_id}/uncordon"): ("/v1/nodes/ghost/uncordon", {}),
    ("POST", "/v1/nodes/{node_id}/drain"): ("/v1/nodes/ghost/drain", {}),
    ("GET", "/v1/nodes/{node_id}/drain"): ("/v1/nodes/ghost/drain", {}),
    ("POST", "/v1/nodes/{node_id}/labels"): ("/v1/nodes/ghost/labels", {"json": {"set": {"a": "b"}}}),
    ("POST", "/v1/nodes/{node_id}/taints"): ("/v1/nodes/ghost/taints", {"json": {"remove": ["a"]}}),
    ("GET", "/v1/events"): ("/v1/events?limit=5", {}),
    # Streams: allowed callers get the stream, which ends after the timeout.
    ("GET", "/v1/events/stream"): ("/v1/events/stream?timeout=0.2", {}),
    ("GET", "/v1/watch/workloads"): ("/v1/watch/workloads?timeout=0.2", {}),
    ("GET", "/v1/watch/nodes"): ("/v1/watch/nodes?timeout=0.2", {}),
    ("GET", "/v1/admin/backup"): ("/v1/admin/backup", {}),
    ("POST", "/v1/admin/restore"): ("/v1/admin/restore", {"json": {"format": "not a backup"}}),
    ("POST", "/v1/admin/liveness/resume"): ("/v1/admin/liveness/resume", {}),
    ("POST", "/v1/admin/recover"): ("/v1/admin/recover", {}),
    ("GET", "/v1/auth/whoami"): ("/v1/auth/whoami", {}),
    ("GET", "/v1/auth/can-i"): ("/v1/auth/can-i?verb=get&resource=nodes", {}),
    ("POST", "/v1/auth/tokens"): ("/v1/auth/tokens", {"json": {"name": "matrix", "role": "viewer",
                                                               "ttlSeconds": 60}}),
    ("GET", "/v1/auth/tokens"): ("/v1/auth/tokens", {}),
    ("DELETE", "/v1/auth/tokens/{token_id}"): ("/v1/auth/tokens/0000000000000000", {}),
    ("GET", "/v1/audit"): ("/v1/audit?limit=5", {}),
    ("GET", "/v1/policy"): ("/v1/policy", {}),
    ("PUT", "/v1/policy"): ("/v1/policy", {"json": {"allowPrivileged": "maybe"}}),  # allowed: 422, nothing written
    ("GET", "/v1/secrets"): ("/v1/secrets", {}),
    ("GET", "/v1/secrets/{name}"): ("/v1/secrets/ghost", {}),
    ("PUT", "/v1/secrets/{name}"): ("/v1/secrets/ghost", {"json": {"stringData": {}}}),  # allowed: 400, nothing
    ("DELETE", "/v1/secrets/{name}"): ("/v1/secrets/ghost", {}),
    ("GET", "/v1/volumes"): ("/v1/volumes", {}),
    ("POST", "/v1/volumes"): ("/v1/volumes", {"json": {}}),  # allowed: 400, nothing written
    ("GET", "/v1/volumes/{name}"): ("/v1/volumes/ghost", {}),
    ("DELETE", "/v1/volumes/{name}"): ("/v1/volumes/ghost", {}),
    ("POST", "/v1/volumes/{name}/snapshots"): ("/v1/volumes/ghost/snapshots", {"json": {"name": "s"}}),
    ("DELETE", "/v1/volumes/{name}/snapshots/{snapshot}"): ("/v1/volumes/ghost/snapshots/s", {}),
    # No rgw section here: an allowed bucket call answers 503 (or 400/404), writing nothing.
    ("GET", "/v1/buckets"): ("/v1/buckets", {}),
    ("POST", "/v1/buckets"): ("/v1/buckets", {"json": {}}),
    ("GET", "/v1/buckets/{name}"): ("/v1/buckets/ghost", {}),
    ("DELETE", "/v1/buckets/{name}"): ("/v1/buckets/ghost", {}),
    ("GET", "/v1/buckets/{name}/keys"): ("/v1/buckets/ghost/keys", {}),
    ("POST", "/v1/buckets/{name}/keys"): ("/v1/buckets/ghost/keys", {"json": {"role": "read-only"}}),
    ("DELETE", "/v1/buckets/{name}/keys/{key_id}"): ("/v1/buckets/ghost/keys/abc123", {}),
    # Automation: allowed calls on a policy that does not exist answer 404 or 400, writing nothing.
    ("GET", "/v1/automation/policies"): ("/v1/automation/policies", {}),
    ("POST", "/v1/automation/policies"): ("/v1/automation/policies", {"json": {}}),
    ("GET", "/v1/automation/policies/{name}"): ("/v1/automation/policies/ghost", {}),
    ("DELETE", "/v1/automation/policies/{name}"): ("/v1/automation/policies/ghost", {}),
    ("GET", "/v1/automation/policies/{name}/replay"): ("/v1/automation/policies/ghost/replay", {}),
    ("GET", "/v1/automation/decisions"): ("/v1/automation/decisions", {}),
    ("POST", "/v1/automation/pause"): ("/v1/automation/pause?policy=ghost", {}),
    ("POST", "/v1/automation/resume"): ("/v1/automation/resume?policy=ghost", {}),
    ("POST", "/v1/join-tokens"): ("/v1/join-tokens", {"json": {"ttlSeconds": 1}}),  # allowed: 422 (under 1 min)
    ("GET", "/v1/join-tokens"): ("/v1/join-tokens", {}),
    ("DELETE", "/v1/join-tokens/{token_id}"): ("/v1/join-tokens/zzzzzz", {}),
    ("POST", "/v1/nodes/{node_id}/revoke"): ("/v1/nodes/-bad-/revoke", {"json": {}}),  # allowed: 422
    ("GET", "/v1/meter/workloads/{name}"): ("/v1/meter/workloads/ghost?since=1h", {}),  # allowed: 503 (no meter)
    ("GET", "/v1/meter/nodes/{name}"): ("/v1/meter/nodes/ghost?since=1h", {}),
    ("GET", "/v1/meter/labels/{label}"): ("/v1/meter/labels/app=ghost?since=1h", {}),
    ("GET", "/v1/meter/top"): ("/v1/meter/top?since=1h", {}),
    ("GET", "/v1/meter/status"): ("/v1/meter/status", {}),
    ("GET", "/v1/why/workloads/{workload_id}"): ("/v1/why/workloads/ghost", {}),  # allowed: 404
    ("GET", "/v1/why/nodes/{node_id}"): ("/v1/why/nodes/ghost", {}),
    ("GET", "/v1/why/cluster"): ("/v1/why/cluster", {}),
    ("GET", "/v1/insights"): ("/v1/insights", {}),
    ("GET", "/v1/investigations"): ("/v1/investigations", {}),
    ("GET", "/v1/rightsize/workloads/{workload_id}"): ("/v1/rightsize/workloads/ghost", {}),
    ("GET", "/v1/forecast/nodes/{node_id}"): ("/v1/forecast/nodes/ghost", {}),
    ("GET", "/v1/forecast/cluster"): ("/v1/forecast/cluster", {}),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayCluster, dict[str, TLSFiles]]]:
    c = start_cluster(tmp_path_factory.mktemp("matrix"), with_agent=False)
    try:
        ids = role_identities(c.pki)
        ids["gateway"] = TLSFiles(c.pki / "ca.crt", c.pki / "gateway.crt", c.pki / "gateway.key")
        yield c, ids
    finally:
        c.stop()


def http(c: GatewayCluster, tls: TLSFiles | None) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(c.pki / "ca.crt"))
    if tls is not None:
        ctx.load_cert_chain(str(tls.cert), str(tls.key))
    return httpx.Client(base_url=c.url, verify=ctx, timeout=30)


def test_requests_cover_every_route() -> None:
    assert set(REQUESTS) == set(REST_RULES)


def test_rest_matrix(cluster: tuple[GatewayCluster, dict[str, TLSFiles]]) -> None:
    c, ids = cluster
    who: dict[str, TLSFiles | None] = {**{k: ids[k] for k in ("admin", "operator", "viewer", "nobody", "node",
                                                               "gateway")}, "anonymous": None}
    wrong: list[str] = []
    for name, tls in who.items():
        with http(c, tls) as client:
            for (method, template), (path, kw) in REQUESTS.items():
                rule = REST_RULES[(method, template)]
                resp = client.request(method, path, **kw)
                allowed = name in MATRIX[f"{rule.verb} {rule.resource}"]
                if allowed == (resp.status_code in DENIED):
                    wrong.append(f"{name} {method} {path}: {resp.status_code} {resp.text[:200]}")
                elif not allowed:
                    body = resp.json()
                    expect = 401 if name == "anonymous" else 403
                    if resp.status_code != expect or (body["verb"], body["resource"]) != (rule.verb, rule.resource):
                        wrong.append(f"{name} {method} {path}: {resp.status_code} {body}")
                assert resp.headers.get("x-request-id")
    assert wrong == []
    with http(c, ids["admin"]) as admin:
        assert admin.get("/v1/workloads").json() == []  # the dry runs wrote nothing


def test_rpc_matrix(cluster: tuple[GatewayCluster, dict[str, TLSFiles]]) -> None:
    c, ids = cluster
    methods = scheduler_methods()

    async def run() -> list[str]:
        wrong = []
        for name in ("admin", "operator", "viewer", "nobody", "node", "gateway"):
            async with secure_channel(c.scheduler_target, ids[name], expect=peer_names.SCHEDULER) as ch:
                for full, rule in RPC_RULES.items():
                    desc = methods[full]
                    req_cls = message_factory.GetMessageClass(desc.input_type)
                    resp_cls = message_factory.GetMessageClass(desc.output_type)
                    try:
                        if desc.server_streaming:  # a watch: its first message (or the refusal) is enough
                            stream = ch.unary_stream(full, request_serializer=req_cls.SerializeToString,
                                                     response_deserializer=resp_cls.FromString)(req_cls(), timeout=10)
                            async for _ in stream:
                                break
                            stream.cancel()
                        else:
                            call = ch.unary_unary(full, request_serializer=req_cls.SerializeToString,
                                                  response_deserializer=resp_cls.FromString)
                            await call(req_cls(), timeout=10)
                        code = grpc.StatusCode.OK
                    except grpc.aio.AioRpcError as err:
                        code = err.code()
                    allowed = name in MATRIX[f"{rule.verb} {rule.resource}"]
                    refused = code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
                    if allowed == refused:
                        wrong.append(f"{name} {full}: {code.name}")
        return wrong

    assert asyncio.run(run()) == []


def test_node_certificate_probes_are_refused_and_write_nothing(
        cluster: tuple[GatewayCluster, dict[str, TLSFiles]]) -> None:
    c, ids = cluster
    with http(c, ids["node"]) as node:
        probes = [node.post("/v1/workloads", json={**MANIFEST, "metadata": {"name": "probe"}}),
                  node.get("/v1/admin/backup"),
                  node.post("/v1/admin/restore?latest=true&force=true")]
    assert [r.status_code for r in probes] == [403, 403, 403]
    assert [r.json()["verb"] for r in probes] == ["apply", "backup", "restore"]
    assert set(probes[1].json()) == {"error", "verb", "resource"}  # no key, no value: only the refusal
    with http(c, ids["admin"]) as admin:
        assert admin.get("/v1/workloads/probe").status_code == 404
        # Recorded before the refusal was answered.
        records = [r for r in admin.get("/v1/audit?who=node:n1&limit=1000").json()["items"]
                   if r["requestId"] in {p.headers["x-request-id"] for p in probes}]
    assert {(r["action"], r["result"], r["via"]) for r in records} == {
        ("POST /v1/workloads", "403", "gateway:gateway"), ("GET /v1/admin/backup", "403", "gateway:gateway"),
        ("POST /v1/admin/restore", "403", "gateway:gateway")}
    assert {r["object"]["query"] for r in records} == {"", "latest=true&force=true"}


def test_viewer_cannot_mutate(cluster: tuple[GatewayCluster, dict[str, TLSFiles]]) -> None:
    c, ids = cluster
    with http(c, ids["operator"]) as operator:
        assert operator.post("/v1/workloads", json={**MANIFEST, "metadata": {"name": "kept"}}).status_code == 201
    try:
        with http(c, ids["viewer"]) as viewer:
            assert viewer.get("/v1/workloads/kept").status_code == 200
            for method, path, kw in (("DELETE", "/v1/workloads/kept", {}), ("POST", "/v1/workloads/kept/stop", {}),
                                     ("POST", "/v1/workloads", {"json": {**MANIFEST, "metadata": {"name": "v"}}})):
                assert viewer.request(method, path, **kw).status_code == 403, path
            assert viewer.get("/v1/workloads/kept").json()["desiredState"] == "Running"
            assert viewer.get("/v1/workloads/v").status_code == 404
    finally:
        with http(c, ids["admin"]) as admin:
            assert admin.delete("/v1/workloads/kept").status_code == 200


def test_tokens_over_rest(cluster: tuple[GatewayCluster, dict[str, TLSFiles]]) -> None:
    c, ids = cluster
    with http(c, ids["admin"]) as admin:
        made = admin.post("/v1/auth/tokens", json={"name": "ci", "role": "operator", "ttlSeconds": 3600}).json()
        brief = admin.post("/v1/auth/tokens", json={"name": "brief", "role": "admin", "ttlSeconds": 1}).json()
        assert admin.post("/v1/auth/tokens", json={"name": "x", "role": "root"}).status_code == 422
    with http(c, None) as anonymous:  # no client certificate: the token is the credential
        bearer = {"authorization": f"Bearer {made['token']}"}
        me = anonymous.get("/v1/auth/whoami", headers=bearer).json()
        assert (me["principal"], me["roles"], me["credential"], me["via"]) == (
            "user:ci", ["operator"], f"token {made['id']}", "gateway:gateway")
        assert anonymous.get("/v1/admin/backup", headers=bearer).status_code == 403
        assert anonymous.get("/v1/workloads", headers={"authorization": "Bearer persys_nonsense"}).status_code == 401
        eventually(lambda: anonymous.get("/v1/workloads", headers={"authorization": f"Bearer {brief['token']}"}
                                         ).status_code == 401, timeout=10, what="the brief token expired")
        with http(c, ids["admin"]) as admin:
            assert admin.delete(f"/v1/auth/tokens/{made['id']}").json()["state"] == "revoked"
            listed = {t["id"]: t for t in admin.get("/v1/auth/tokens").json()}
            assert listed[made["id"]]["state"] == "revoked" and "sha256" not in listed[made["id"]]
        # The scheduler checks the token on every call: refused at once, however the gateway caches.
        resp = anonymous.post("/v1/workloads", headers=bearer, json={**MANIFEST, "metadata": {"name": "t"}})
        assert resp.status_code == 401, resp.text
    with http(c, ids["admin"]) as admin:
        assert admin.get("/v1/workloads/t").status_code == 404


def test_audit_names_the_principal_through_the_gateway(cluster: tuple[GatewayCluster, dict[str, TLSFiles]]) -> None:
    c, ids = cluster
    with http(c, ids["operator"]) as operator:
        resp = operator.post("/v1/workloads:batch", headers={"x-request-id": "batch-1"},
                             content=json.dumps([{**MANIFEST, "metadata": {"name": f"b{i}"}} for i in range(3)]))
        assert resp.status_code == 200 and resp.headers["x-request-id"] == "batch-1"
    with http(c, ids["admin"]) as admin:
        try:
            records = [r for r in admin.get("/v1/audit?limit=1000").json()["items"] if r["requestId"] == "batch-1"]
            assert len(records) == 1  # a batch is one record
            assert records[0]["principal"] == "user:operator" and records[0]["via"] == "gateway:gateway"
            assert records[0]["object"]["workloads"] == 3 and records[0]["result"] == "OK"
        finally:
            for i in range(3):
                admin.delete(f"/v1/workloads/b{i}")


def test_persysctl_auth_and_audit(cluster: tuple[GatewayCluster, dict[str, TLSFiles]]) -> None:
    c, _ = cluster
    env = c.ctl_env()  # the legacy admin certificate: group persys:admins
    me = json.loads(ctl("auth", "whoami", "-o", "json", env=env).stdout)
    assert (me["principal"], me["roles"], me["credential"]) == ("user:admin", ["admin"], "certificate")
    assert ctl("auth", "can-i", "delete", "nodes", env=env).stdout.startswith("yes")
    made = ctl("auth", "token", "create", "robot", "--role", "viewer", "--ttl", "1h", env=env)
    secret = made.stdout.strip()
    assert secret.startswith("persys_") and "not shown again" in made.stderr
    token_id = secret.split("_")[1]

    # A configuration with a token and no certificate at all.
    only_token = c.tmp / "token.yaml"
    only_token.write_text(yaml.safe_dump({"server": c.url, "ca": str(c.pki / "ca.crt"), "token": secret}))
    robot = {"PERSYS_CONFIG": str(only_token)}
    assert json.loads(ctl("auth", "whoami", "-o", "json", env=robot).stdout)["principal"] == "user:robot"
    assert json.loads(ctl("get", "workloads", "-o", "json", env=robot).stdout) == []
    refused = ctl("auth", "can-i", "apply", "workloads", env=robot, check=False)
    assert refused.returncode == 1 and refused.stdout.startswith("no")
    applied = ctl("apply", "-f", "-", env=robot, check=False, stdin=yaml.safe_dump(MANIFEST))
    assert applied.returncode == 1 and "apply" in applied.stderr and "workloads" in applied.stderr
    # --token (or $PERSYS_TOKEN) wins over the configured certificate.
    assert json.loads(ctl("--token", secret, "auth", "whoami", "-o", "json", env=env).stdout)["roles"] == ["viewer"]

    listed = json.loads(ctl("auth", "token", "list", "-o", "json", env=env).stdout)
    assert [t["state"] for t in listed if t["id"] == token_id] == ["active"]
    assert "revoked" in ctl("auth", "token", "revoke", token_id, env=env).stdout
    gone = ctl("get", "workloads", env=robot, check=False)
    assert gone.returncode == 1 and "revoked" in gone.stderr

    audit = json.loads(ctl("audit", "--who", "user:admin", "--since", "10m", "-o", "json", env=env).stdout)
    actions = [(r["action"].rsplit("/", 1)[-1], r["result"]) for r in audit]
    assert ("CreateToken", "OK") in actions and ("RevokeToken", "OK") in actions
    assert all("persys_" not in json.dumps(r) for r in audit)  # no secret in the log
    denied = json.loads(ctl("audit", "--who", "user:robot", "-o", "json", env=env).stdout)
    assert any(r["action"].endswith("/ApplyWorkload") and r["result"] == "PERMISSION_DENIED" for r in denied) \
        or any(r["action"] == "POST /v1/workloads" and r["result"] == "403" for r in denied)


def test_a_certificate_from_another_ca_is_still_refused(cluster: tuple[GatewayCluster, dict[str, TLSFiles]],
                                                        tmp_path: Path) -> None:
    c, _ = cluster
    rogue = ClusterCA(tmp_path / "rogue")
    rogue.ensure()
    bad = rogue.issue("admin", "admin")  # a certificate is optional now, but one presented is verified
    with http(c, bad) as client, pytest.raises(httpx.HTTPError):
        client.get("/v1/workloads")
