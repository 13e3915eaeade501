"""Node join, renewal and revocation against an in-process scheduler over real gRPC and TLS:
a token joins one node once (used, expired and forged tokens are refused and audited; of
concurrent joins with one token exactly one wins), a wrong CA pin stops the join before the
token leaves the node, the join listener serves Join alone while the main port still demands a
client certificate, a node renews only its own identity, and a revoked node is refused on every
call and its open watch is ended."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from persys._pb.persys.v1 import auth_pb2 as apb
from persys._pb.persys.v1 import auth_pb2_grpc as apb_grpc
from persys._pb.persys.v1 import certificates_pb2 as cpb
from persys._pb.persys.v1 import certificates_pb2_grpc as cpb_grpc
from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.agent import node_identity
from persys.agent.cert_renewal import CertRenewer
from persys.agent.join import JoinError, join
from persys.cli.servers.signer_options import signer_from_options
from persys.scheduler.access import certificates as cert_registry
from persys.scheduler.access.join_tokens import JOIN_TOKENS
from persys.scheduler.rpc.server import RunningScheduler, start_scheduler
from persys.security import peer_names
from persys.security.ca_pin import pin_of_pem
from persys.security.csr import new_key_and_csr
from persys.security.grpc_tls import secure_channel
from persys.security.join_tokens import new_join_token
from persys.security.pki import ClusterCA, TLSFiles, standard_identities

Cluster = tuple[RunningScheduler, dict[str, TLSFiles], Path]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    s = await start_scheduler(f"sqlite:///{tmp_path / 'state.db'}", "memory://", "127.0.0.1:0", ids["scheduler"],
                              signer_for=lambda store: signer_from_options(store, ca_dir=ca.dir),
                              join_listen="127.0.0.1:0", node_cert_ttl=600)
    yield s, ids, tmp_path
    await s.stop()


def main_target(s: RunningScheduler) -> str:
    return f"127.0.0.1:{s.port}"


def join_target(s: RunningScheduler) -> str:
    return f"127.0.0.1:{s.join_port}"


async def new_token(s: RunningScheduler, admin: TLSFiles, node_id: str = "") -> tuple[str, str]:
    async with secure_channel(main_target(s), admin, expect=peer_names.SCHEDULER) as ch:
        r = await cpb_grpc.NodeAccessStub(ch).CreateJoinToken(
            cpb.CreateJoinTokenRequest(ttl_seconds=600, node_id=node_id), timeout=10)
    return r.token, r.ca_pin


async def join_records(s: RunningScheduler, admin: TLSFiles) -> list[dict[str, object]]:
    async with secure_channel(main_target(s), admin, expect=peer_names.SCHEDULER) as ch:
        resp = await apb_grpc.AuthStub(ch).ListAudit(apb.ListAuditRequest(limit=1000), timeout=10)
    return [r for r in map(json.loads, resp.items) if r["action"] == "/persys.v1.NodeJoin/Join"]


async def test_a_token_joins_once_and_refusals_are_audited(cluster: Cluster) -> None:
    s, ids, tmp = cluster
    token, pin = await new_token(s, ids["admin"])
    assert pin == pin_of_pem(ids["admin"].ca.read_bytes())
    files = await join(join_target(s), token, pin, "j1", ("localhost",), tmp / "j1")
    # Only the node's own key (0600), its certificate and the CA bundle.
    assert sorted(p.name for p in (tmp / "j1").iterdir()) == ["ca.crt", "node-j1.crt", "node-j1.key"]
    assert os.stat(files.key).st_mode & 0o777 == 0o600 and os.stat(tmp / "j1").st_mode & 0o777 == 0o700
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert cert.subject.rfc4514_string() == "CN=node:j1"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", peer_names.node("j1")}
    assert 500 < (cert.not_valid_after_utc.timestamp() - time.time()) <= 600  # the scheduler's lifetime
    # Recorded for `persys certs status` (serial, identity, expiry; never the certificate).
    assert [(r.identity, r.serial, r.signer) for r in await cert_registry.list_records(s.store)] == [
        ("node:j1", format(cert.serial_number, "x"), "builtin")]

    with pytest.raises(JoinError, match=r"token \w+ is used"):
        await join(join_target(s), token, pin, "j2", ("localhost",), tmp / "j2")
    token_id = token.split(".")[0]
    forged = f"{token_id}.{'x' * 32}"
    with pytest.raises(JoinError, match="unknown token"):
        await join(join_target(s), forged, pin, "j3", ("localhost",), tmp / "j3")
    # An expired one (written as the scheduler would have written it two hours ago).
    expired_token, record = new_join_token(3600, "", "user:admin", time.time() - 7200)
    await s.store.put(JOIN_TOKENS + record.id, json.dumps(record.to_doc()).encode())
    with pytest.raises(JoinError, match=rf"token {record.id} is expired"):
        await join(join_target(s), expired_token, pin, "j4", ("localhost",), tmp / "j4")
    assert not (tmp / "j2").exists() and not (tmp / "j3").exists() and not (tmp / "j4").exists()

    records = await join_records(s, ids["admin"])
    got = [(r["principal"], r["credential"], r["result"]) for r in records]
    assert got == [("node:j1", f"join token {token_id}", "OK"),
                   ("node:j2", f"join token {token_id}", "PERMISSION_DENIED"),
                   ("node:j3", f"join token {token_id}", "UNAUTHENTICATED"),
                   ("node:j4", f"join token {record.id}", "PERMISSION_DENIED")]
    text = json.dumps(records)
    assert token.split(".")[1] not in text and "x" * 32 not in text  # secrets never in the log
    async with secure_channel(main_target(s), ids["admin"], expect=peer_names.SCHEDULER) as ch:
        listed = await cpb_grpc.NodeAccessStub(ch).ListJoinTokens(cpb.ListJoinTokensRequest(), timeout=10)
    docs = {d["id"]: d for d in map(json.loads, listed.items)}
    assert (docs[token_id]["state"], docs[token_id]["used_by"]) == ("used", "j1")
    assert "sha256" not in docs[token_id] and docs[record.id]["state"] == "expired"


async def test_concurrent_joins_with_one_token_one_wins(cluster: Cluster) -> None:
    s, ids, tmp = cluster
    token, pin = await new_token(s, ids["admin"])
    results = await asyncio.gather(*(join(join_target(s), token, pin, f"race-{i}", ("localhost",), tmp / f"r{i}")
                                     for i in range(5)), return_exceptions=True)
    won = [r for r in results if isinstance(r, TLSFiles)]
    assert len(won) == 1, results
    assert all(isinstance(r, JoinError) and "is used" in str(r) for r in results if r not in won)


async def test_a_wrong_pin_stops_the_join_before_the_token_is_sent(cluster: Cluster, tmp_path: Path) -> None:
    s, ids, tmp = cluster
    token, _ = await new_token(s, ids["admin"])
    other = ClusterCA(tmp_path / "other-ca")
    other.ensure()
    with pytest.raises(JoinError, match=r"refusing the scheduler .* no CA in the server's chain matches"):
        await join(join_target(s), token, pin_of_pem(other.ca_cert_path.read_bytes()), "p1", ("localhost",),
                   tmp / "p1")
    assert [r for r in await join_records(s, ids["admin"]) if r["principal"] == "node:p1"] == []
    # The token is still unused: it can join the node once the operator gives the right pin.
    await join(join_target(s), token, pin_of_pem(ids["admin"].ca.read_bytes()), "p1", ("localhost",), tmp / "p1")


async def test_the_join_port_serves_join_only_and_the_main_port_needs_a_certificate(cluster: Cluster) -> None:
    s, ids, _ = cluster
    no_cert = grpc.ssl_channel_credentials(root_certificates=ids["admin"].ca.read_bytes())
    opts = [("grpc.ssl_target_name_override", peer_names.SCHEDULER)]
    async with grpc.aio.secure_channel(join_target(s), no_cert, options=opts) as ch:
        calls = [pb_grpc.AgentControlStub(ch).ListNodes(pb.ListRequest(), timeout=5),
                 cpb_grpc.NodeCertificatesStub(ch).Renew(cpb.RenewRequest(), timeout=5),
                 cpb_grpc.NodeAccessStub(ch).CreateJoinToken(cpb.CreateJoinTokenRequest(), timeout=5),
                 apb_grpc.AuthStub(ch).WhoAmI(apb.WhoAmIRequest(), timeout=5)]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    async with grpc.aio.secure_channel(main_target(s), no_cert, options=opts) as ch:
        for call in (pb_grpc.AgentControlStub(ch).ListNodes(pb.ListRequest(), timeout=5),
                     cpb_grpc.NodeJoinStub(ch).Join(cpb.JoinRequest(), timeout=5)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # no handshake without a client certificate


async def test_renewal_is_for_the_callers_own_identity_and_revocation_ends_everything(cluster: Cluster) -> None:
    s, ids, tmp = cluster
    token, pin = await new_token(s, ids["admin"])
    files = await join(join_target(s), token, pin, "j1", ("localhost", "127.0.0.1"), tmp / "j1")
    _, csr = new_key_and_csr("node:j1")
    async with secure_channel(main_target(s), files, expect=peer_names.SCHEDULER) as ch:
        renewed = await cpb_grpc.NodeCertificatesStub(ch).Renew(cpb.RenewRequest(csr_pem=csr), timeout=10)
    cert = x509.load_pem_x509_certificate(renewed.certificate_pem)
    assert renewed.node_id == "j1" and cert.subject.rfc4514_string() == "CN=node:j1"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n) for n in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1"}
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", peer_names.node("j1")}
    for who in ("admin", "gateway", "scheduler"):  # only nodes renew here, and only themselves
        async with secure_channel(main_target(s), ids[who], expect=peer_names.SCHEDULER) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await cpb_grpc.NodeCertificatesStub(ch).Renew(cpb.RenewRequest(csr_pem=csr), timeout=10)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED

    async with secure_channel(main_target(s), files, expect=peer_names.SCHEDULER) as ch:
        node = pb_grpc.AgentControlStub(ch)
        watch = node.WatchAssignments(pb.WatchAssignmentsRequest(node_id="j1", deltas=True))
        await watch.read()  # the first (full) set: the stream is open
        async with secure_channel(main_target(s), ids["admin"], expect=peer_names.SCHEDULER) as admin:
            t0 = time.monotonic()
            await cpb_grpc.NodeAccessStub(admin).RevokeNode(cpb.RevokeNodeRequest(node_id="j1", reason="stolen"),
                                                            timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(watch.read(), 5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "node-revoked" in str(err.value.details())
        assert time.monotonic() - t0 < 2.0  # on this replica: at once
        records = [r for r in await cert_registry.list_records(s.store) if r.identity == "node:j1"]
        assert len(records) == 2 and all(r.revoked_at for r in records)  # joined, renewed: both marked
        for call in (node.Heartbeat(pb.HeartbeatRequest(node_id="j1"), timeout=5),
                     cpb_grpc.NodeCertificatesStub(ch).Renew(cpb.RenewRequest(csr_pem=csr), timeout=5)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "node-revoked" in str(err.value.details())
    # Not even a token naming it brings the identity back.
    named, _ = await new_token(s, ids["admin"], node_id="j1")
    with pytest.raises(JoinError, match="node-revoked"):
        await join(join_target(s), named, pin, "j1", ("localhost",), tmp / "j1-again")


async def test_a_token_naming_no_node_cannot_take_over_a_known_node(cluster: Cluster) -> None:
    s, ids, tmp = cluster
    token, pin = await new_token(s, ids["admin"])
    await s.scheduler.store.put("/persys/nodes/busy", json.dumps({"id": "busy"}).encode())
    with pytest.raises(JoinError, match="node busy exists; only a token naming it"):
        await join(join_target(s), token, pin, "busy", ("localhost",), tmp / "busy")
    named, _ = await new_token(s, ids["admin"], node_id="busy")
    await join(join_target(s), named, pin, "", ("localhost",), tmp / "busy")  # the token says which node
    assert node_identity.usable(node_identity.node_files(tmp / "busy", "busy"), time.time())


async def test_the_renewer_keeps_its_certificate_while_unreachable_then_renews(cluster: Cluster) -> None:
    s, ids, tmp = cluster
    token, pin = await new_token(s, ids["admin"])
    files = await join(join_target(s), token, pin, "k1", ("localhost",), tmp / "k1")
    before = files.cert.read_bytes(), files.key.read_bytes()
    target = [f"unix:{tmp / 'nobody-listens'}"]
    renewed = asyncio.Event()
    # Jitter 0: the renewal is due at once.
    renewer = CertRenewer("k1", files, lambda: target[0], renewed.set, jitter=0.0)
    task = asyncio.create_task(renewer.run())
    try:
        for _ in range(200):
            if renewer.failures >= 2:
                break
            await asyncio.sleep(0.1)
        assert renewer.failures >= 2
        assert (files.cert.read_bytes(), files.key.read_bytes()) == before and not renewed.is_set()  # kept
        target[0] = main_target(s)  # the scheduler is back
        await asyncio.wait_for(renewed.wait(), 20)
    finally:
        task.cancel()
    assert renewer.renewals >= 1
    assert files.cert.read_bytes() != before[0] and files.key.read_bytes() != before[1]
    assert os.stat(files.key).st_mode & 0o777 == 0o600
    node_identity.check_issued(files.cert.read_bytes(), files.key.read_bytes(), "k1")


async def test_revoking_an_id_no_node_has_needs_force(cluster: Cluster) -> None:
    """Issue #30, 8: a typo is not a revocation. Known ids (a registered node, one with a join
    token naming it) are revoked as before; an id nothing knows is refused naming the field and
    --force, and nothing is recorded; with force it is revoked (no node may ever use it)."""
    s, ids, _ = cluster
    await s.scheduler.store.put("/persys/nodes/known1", json.dumps({"id": "known1"}).encode())
    await new_token(s, ids["admin"], node_id="coming1")
    async with secure_channel(main_target(s), ids["admin"], expect=peer_names.SCHEDULER) as admin:
        stub = cpb_grpc.NodeAccessStub(admin)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.RevokeNode(cpb.RevokeNodeRequest(node_id="knwon1", reason="typo"), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "node_id: no node 'knwon1' is known" in str(err.value.details())
        assert "--force" in str(err.value.details())
        for known in ("known1", "coming1"):
            await stub.RevokeNode(cpb.RevokeNodeRequest(node_id=known), timeout=10)
        await stub.RevokeNode(cpb.RevokeNodeRequest(node_id="known1"), timeout=10)  # again: still fine
        await stub.RevokeNode(cpb.RevokeNodeRequest(node_id="future9", force=True), timeout=10)
    assert s.revocations is not None
    for nid in ("known1", "coming1", "future9"):
        assert await s.revocations.revoked_in_store(nid), nid
    assert not await s.revocations.revoked_in_store("knwon1")
