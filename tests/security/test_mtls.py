"""Mutual TLS on the scheduler's gRPC port: peers without a cluster certificate are refused."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.scheduler.rpc.server import RunningScheduler, start_scheduler
from persys.security import peer_names
from persys.security.grpc_tls import secure_channel
from persys.security.pki import ClusterCA, standard_identities


@pytest.fixture
async def scheduler(tmp_path: Path) -> RunningScheduler:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    s = await start_scheduler(f"sqlite:///{tmp_path / 'state.db'}", "memory://", "127.0.0.1:0", ids["scheduler"])
    s.ids = ids  # type: ignore[attr-defined]
    yield s
    await s.stop()


async def test_client_with_cluster_cert_is_served(scheduler: RunningScheduler) -> None:
    async with secure_channel(f"127.0.0.1:{scheduler.port}", scheduler.ids["admin"], expect=peer_names.SCHEDULER) as ch:  # type: ignore[attr-defined]
        h = await pb_grpc.AgentControlStub(ch).Health(pb.HealthRequest(), timeout=5)
    assert h.mode == "normal" and h.store_ok


async def test_client_without_certificate_is_refused(scheduler: RunningScheduler) -> None:
    ca_pem = scheduler.ids["admin"].ca.read_bytes()  # type: ignore[attr-defined]
    creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)  # trusts the server, presents nothing
    async with grpc.aio.secure_channel(f"127.0.0.1:{scheduler.port}", creds) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await pb_grpc.AgentControlStub(ch).Health(pb.HealthRequest(), timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_certificate_from_another_ca_is_refused(scheduler: RunningScheduler, tmp_path: Path) -> None:
    rogue = ClusterCA(tmp_path / "rogue")
    rogue.ensure()
    bad = rogue.issue("admin", "admin")
    ca_pem = scheduler.ids["admin"].ca.read_bytes()  # type: ignore[attr-defined]
    creds = grpc.ssl_channel_credentials(ca_pem, bad.key.read_bytes(), bad.cert.read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{scheduler.port}", creds) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await pb_grpc.AgentControlStub(ch).Health(pb.HealthRequest(), timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_node_identity_is_enforced(scheduler: RunningScheduler) -> None:
    agent = scheduler.ids["agent"]  # type: ignore[attr-defined]  # certificate for node:n1
    async with secure_channel(f"127.0.0.1:{scheduler.port}", agent, expect=peer_names.SCHEDULER) as ch:
        stub = pb_grpc.AgentControlStub(ch)
        ok = await stub.RegisterNode(pb.RegisterNodeRequest(node_id="n1"), timeout=5)
        assert ok.accepted
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.RegisterNode(pb.RegisterNodeRequest(node_id="n2"), timeout=5)
        assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.ListWorkloads(pb.ListRequest(), timeout=5)  # agents cannot use client operations
        assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_ca_is_reused_and_keys_are_private(tmp_path: Path) -> None:
    ca = ClusterCA(tmp_path)
    ca.ensure()
    first = ca.ca_cert_path.read_bytes()
    ca.ensure()
    assert ca.ca_cert_path.read_bytes() == first
    files = ca.issue("gateway", "gateway")
    again = ca.issue("gateway", "gateway")
    assert files.cert.read_bytes() == again.cert.read_bytes()
    assert (ca.ca_key_path.stat().st_mode & 0o777) == 0o600
    assert (files.key.stat().st_mode & 0o777) == 0o600


def test_servers_accept_the_keepalive_pings_our_clients_send() -> None:
    """A server that counts our idle pings as abuse ends the connection (GOAWAY too_many_pings)
    and fails the calls on it: seen as a 503 from the gateway under a schemathesis run."""
    from persys.security.grpc_tls import CLIENT_KEEPALIVE_OPTIONS, SERVER_KEEPALIVE_OPTIONS, server_options

    client, server = dict(CLIENT_KEEPALIVE_OPTIONS), dict(server_options())
    assert dict(SERVER_KEEPALIVE_OPTIONS).items() <= server.items()
    if client["grpc.keepalive_permit_without_calls"]:
        assert server["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.http2.min_recv_ping_interval_without_data_ms"] < client["grpc.keepalive_time_ms"]
