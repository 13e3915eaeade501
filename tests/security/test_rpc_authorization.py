"""Authorization of the scheduler's client RPCs over real mTLS: roles from certificate groups,
identities forwarded only by gateways, bearer tokens, and the audit record of each mutation."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from persys._pb.persys.v1 import auth_pb2 as apb
from persys._pb.persys.v1 import auth_pb2_grpc as apb_grpc
from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.scheduler.rpc.server import RunningScheduler, start_scheduler
from persys.security import forwarding, peer_names
from persys.security.grpc_tls import secure_channel
from persys.security.identity import Identity, Kind
from persys.security.pki import ClusterCA, TLSFiles, standard_identities
from persys.security.tokens import parse as parse_token
from tests.security.role_certs import issue_user

MANIFEST = json.dumps({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "w1"},
                       "spec": {"type": "process", "process": {"command": ["sleep", "1"]}}}).encode()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[RunningScheduler, dict[str, TLSFiles]]]:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    ids["viewer"] = issue_user(tmp_path / "pki", "vera", ("persys:viewers",))
    ids["operator"] = issue_user(tmp_path / "pki", "otto", ("persys:operators",))
    s = await start_scheduler(f"sqlite:///{tmp_path / 'state.db'}", "memory://", "127.0.0.1:0", ids["scheduler"])
    yield s, ids
    await s.stop()


def _target(s: RunningScheduler) -> str:
    return f"127.0.0.1:{s.port}"


async def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call  # type: ignore[misc]
    return exc.value.code()


async def _audit(s: RunningScheduler, admin: TLSFiles) -> list[dict[str, object]]:
    async with secure_channel(_target(s), admin, expect=peer_names.SCHEDULER) as ch:
        resp = await apb_grpc.AuthStub(ch).ListAudit(apb.ListAuditRequest(limit=100), timeout=5)
    return [json.loads(i) for i in resp.items]


async def test_roles_decide_and_refusals_write_nothing(cluster: tuple[RunningScheduler, dict[str, TLSFiles]]
                                                       ) -> None:
    s, ids = cluster
    for who, expect in (("agent", grpc.StatusCode.PERMISSION_DENIED), ("viewer", grpc.StatusCode.PERMISSION_DENIED),
                        ("scheduler", grpc.StatusCode.PERMISSION_DENIED),
                        ("gateway", grpc.StatusCode.UNAUTHENTICATED)):
        async with secure_channel(_target(s), ids[who], expect=peer_names.SCHEDULER) as ch:
            stub = pb_grpc.AgentControlStub(ch)
            assert await _code(stub.ApplyWorkload(pb.ApplyWorkloadRequest(manifest_json=MANIFEST), timeout=5)) \
                == expect, who
            assert await _code(stub.Backup(pb.BackupRequest(), timeout=5)) == expect, who
    assert "w1" not in s.scheduler.state.workloads
    async with secure_channel(_target(s), ids["viewer"], expect=peer_names.SCHEDULER) as ch:
        page = await pb_grpc.AgentControlStub(ch).ListWorkloads(pb.ListRequest(), timeout=5)
        assert list(page.items) == []
    async with secure_channel(_target(s), ids["operator"], expect=peer_names.SCHEDULER) as ch:
        stub = pb_grpc.AgentControlStub(ch)
        r = await stub.ApplyWorkload(pb.ApplyWorkloadRequest(manifest_json=MANIFEST), timeout=5,
                                     metadata=((forwarding.REQUEST_ID, "req-42"),))
        assert r.workload_id == "w1"
        assert await _code(stub.Backup(pb.BackupRequest(), timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    records = await _audit(s, ids["admin"])
    applied = [r for r in records if r["result"] == "OK" and r["action"].endswith("/ApplyWorkload")]  # type: ignore[union-attr]
    assert applied == [{**applied[0], "principal": "user:otto", "requestId": "req-42",
                        "object": {"workload_id": "w1"}}]
    denied = {(r["principal"], r["action"].rsplit("/", 1)[1], r["result"]) for r in records}  # type: ignore[union-attr]
    assert ("node:n1", "ApplyWorkload", "PERMISSION_DENIED") in denied
    assert ("unknown:anonymous", "Backup", "UNAUTHENTICATED") in denied
    assert ("user:otto", "Backup", "PERMISSION_DENIED") in denied


async def test_only_a_gateway_may_forward_an_identity(cluster: tuple[RunningScheduler, dict[str, TLSFiles]]
                                                      ) -> None:
    s, ids = cluster
    as_admin = forwarding.metadata_for(Identity(Kind.USER, "alice", ("persys:admins",)), None, "r1")
    # A node claiming to forward an admin.
    async with secure_channel(_target(s), ids["agent"], expect=peer_names.SCHEDULER) as ch:
        who = await _code(apb_grpc.AuthStub(ch).WhoAmI(apb.WhoAmIRequest(), timeout=5, metadata=as_admin))
        assert who == grpc.StatusCode.PERMISSION_DENIED
    async with secure_channel(_target(s), ids["gateway"], expect=peer_names.SCHEDULER) as ch:
        me = await apb_grpc.AuthStub(ch).WhoAmI(apb.WhoAmIRequest(), timeout=5, metadata=as_admin)
        assert (me.principal, list(me.roles), me.via) == ("user:alice", ["admin"], "gateway:gateway")
        assert await _code(apb_grpc.AuthStub(ch).WhoAmI(apb.WhoAmIRequest(), timeout=5)) \
            == grpc.StatusCode.UNAUTHENTICATED


async def test_tokens_expire_and_revoke(cluster: tuple[RunningScheduler, dict[str, TLSFiles]]) -> None:
    s, ids = cluster
    async with secure_channel(_target(s), ids["admin"], expect=peer_names.SCHEDULER) as ch:
        auth = apb_grpc.AuthStub(ch)
        made = await auth.CreateToken(apb.CreateTokenRequest(name="ci", role="operator", ttl_seconds=3600),
                                      timeout=5)
        short = await auth.CreateToken(apb.CreateTokenRequest(name="brief", role="admin", ttl_seconds=0.001),
                                       timeout=5)
        assert await _code(auth.CreateToken(apb.CreateTokenRequest(name="x", role="root"), timeout=5)) \
            == grpc.StatusCode.INVALID_ARGUMENT
        listed = [json.loads(i) for i in (await auth.ListTokens(apb.ListTokensRequest(), timeout=5)).items]
        assert all("sha256" not in t for t in listed) and made.token not in json.dumps(listed)
    kv = await s.store.get("/persys-auth/tokens/" + json.loads(made.token_json)["id"])
    parsed = parse_token(made.token)  # the secret may itself hold "_": the token's own parser splits it
    assert kv is not None and parsed is not None and parsed[1] not in kv.value.decode()  # only the hash is stored

    bearer = ((forwarding.AUTHORIZATION, f"Bearer {made.token}"),)
    # The token is the credential, whoever carries it.
    async with secure_channel(_target(s), ids["agent"], expect=peer_names.SCHEDULER) as ch:
        me = await apb_grpc.AuthStub(ch).WhoAmI(apb.WhoAmIRequest(), timeout=5, metadata=bearer)
        assert (me.principal, list(me.roles), me.credential) == ("user:ci", ["operator"],
                                                                 f"token {json.loads(made.token_json)['id']}")
        expired = ((forwarding.AUTHORIZATION, f"Bearer {short.token}"),)
        assert await _code(apb_grpc.AuthStub(ch).WhoAmI(apb.WhoAmIRequest(), timeout=5, metadata=expired)) \
            == grpc.StatusCode.UNAUTHENTICATED
    async with secure_channel(_target(s), ids["admin"], expect=peer_names.SCHEDULER) as ch:
        await apb_grpc.AuthStub(ch).RevokeToken(apb.RevokeTokenRequest(id=json.loads(made.token_json)["id"]),
                                                timeout=5)
    async with secure_channel(_target(s), ids["agent"], expect=peer_names.SCHEDULER) as ch:
        stub = pb_grpc.AgentControlStub(ch)
        assert await _code(stub.ApplyWorkload(pb.ApplyWorkloadRequest(manifest_json=MANIFEST), timeout=5,
                                              metadata=bearer)) == grpc.StatusCode.UNAUTHENTICATED
    assert "w1" not in s.scheduler.state.workloads


async def test_a_gateway_itself_reads_health_and_nothing_else(cluster: tuple[RunningScheduler, dict[str, TLSFiles]]
                                                              ) -> None:
    """/readyz is public, so the gateway reads the health document as itself (roles.GATEWAY_PROBE);
    the same call from any other service identity, or any other call as the gateway itself, is
    refused."""
    s, ids = cluster
    async with secure_channel(_target(s), ids["gateway"], expect=peer_names.SCHEDULER) as ch:
        h = await pb_grpc.AgentControlStub(ch).Health(pb.HealthRequest(), timeout=5)
        assert h.store_ok
        stub = pb_grpc.AgentControlStub(ch)
        assert await _code(stub.ListWorkloads(pb.ListRequest(), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    for who in ("agent", "scheduler"):
        async with secure_channel(_target(s), ids[who], expect=peer_names.SCHEDULER) as ch:
            assert await _code(pb_grpc.AgentControlStub(ch).Health(pb.HealthRequest(), timeout=5)) \
                == grpc.StatusCode.PERMISSION_DENIED, who
