"""Issue #12's probes on certificates and nodes, against separate processes over mutual TLS on a
real etcd: a scheduler and a gateway started by `persys`, agents' calls made with the very
certificates `persys certs` issues. Every hostile call is refused with the rule it broke and
leaves nothing under /persys/nodes/."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.security import peer_names
from persys.security.grpc_tls import secure_channel
from persys.security.pki import TLSFiles
from persys.store.etcd import EtcdStore
from tests.e2e.harness import Components, Proc, eventually, persys
from tests.fixtures_infra import EtcdServer, start_etcd

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Components, EtcdServer]]:
    etcd = start_etcd(tmp_path / "etcd")
    try:  # etcd is stopped also when the components fail to start
        c = Components(tmp_path, etcd.url, nodes=())  # no agents: the test speaks for nodes itself
        try:
            yield c, etcd
        finally:
            c.stop()
    finally:
        etcd.stop()


def issue_node(pki: Path, out: Path, node_id: str) -> TLSFiles:
    """What an operator hands one machine: `persys certs issue` into a folder without the CA key."""
    subprocess.run(persys("certs", "issue", "--ca-dir", str(pki), "--role", "node", "--node-id", node_id,
                          "--host", "127.0.0.1", "--out", str(out)), check=True, capture_output=True, timeout=60)
    assert not (out / "ca.key").exists()
    return TLSFiles(out / "ca.crt", out / f"node-{node_id}.crt", out / f"node-{node_id}.key")


def own(pki: Path, name: str) -> TLSFiles:
    return TLSFiles(pki / "ca.crt", pki / f"{name}.crt", pki / f"{name}.key")


def stored_nodes(etcd: EtcdServer) -> list[str]:
    async def read() -> list[str]:
        store = EtcdStore([etcd.endpoint])
        try:
            kvs, _ = await store.range("/persys/nodes/")
            return [kv.key for kv in kvs]
        finally:
            await store.close()

    return asyncio.run(read())


def register(target: str, tls: TLSFiles, **fields: Any) -> grpc.StatusCode:
    """A RegisterNode call; the status it ended with."""
    caps = fields.pop("capabilities", {})

    async def call() -> grpc.StatusCode:
        async with secure_channel(target, tls, expect=peer_names.SCHEDULER) as ch:
            try:
                await pb_grpc.AgentControlStub(ch).RegisterNode(
                    pb.RegisterNodeRequest(capabilities=pb.NodeCapabilities(**caps), **fields), timeout=20)
            except grpc.aio.AioRpcError as err:
                register.details = err.details() or ""  # type: ignore[attr-defined]
                return err.code()
        return grpc.StatusCode.OK

    return asyncio.run(call())


def test_hostile_registrations_are_refused_and_write_nothing(cluster: tuple[Components, EtcdServer],
                                                            tmp_path: Path) -> None:
    c, etcd = cluster
    node_a = issue_node(c.pki, tmp_path / "machine-a", "node-a")
    target = c.replica_targets[0]
    probes: list[tuple[str, TLSFiles, dict[str, Any], grpc.StatusCode, str]] = [
        ("admin certificate registers a node", own(c.pki, "admin"), {"node_id": "n1"},
         grpc.StatusCode.PERMISSION_DENIED, "rule node-identity"),
        ("gateway certificate registers a node", own(c.pki, "gateway"), {"node_id": "n1"},
         grpc.StatusCode.PERMISSION_DENIED, "rule node-identity"),
        ("node-a registers as node-b", node_a, {"node_id": "node-b"},
         grpc.StatusCode.PERMISSION_DENIED, "rule own-node-only"),
        ("a path as node id", node_a, {"node_id": "../../etc"}, grpc.StatusCode.INVALID_ARGUMENT, "rule node-id"),
        ("a NUL in the node id", node_a, {"node_id": "node-a\0"}, grpc.StatusCode.INVALID_ARGUMENT, "rule node-id"),
        ("a 10,000-character node id", own(c.pki, "admin"), {"node_id": "x" * 10_000},
         grpc.StatusCode.INVALID_ARGUMENT, "rule node-id"),
        ("10^9 CPUs", node_a, {"node_id": "node-a", "capabilities": {"cpu_millicores": 10**12}},
         grpc.StatusCode.INVALID_ARGUMENT, "rule capacity-range"),
        ("negative memory", node_a, {"node_id": "node-a", "capabilities": {"memory_mb": -1024}},
         grpc.StatusCode.INVALID_ARGUMENT, "rule capacity-range"),
        ("a reserved label", node_a, {"node_id": "node-a", "labels": {"persys.dev/secure": "true"}},
         grpc.StatusCode.PERMISSION_DENIED, "rule reserved-label"),
        ("a terminal escape in a label", node_a, {"node_id": "node-a", "labels": {"zone": "\x1b[2J\x1b]0;x\x07"}},
         grpc.StatusCode.INVALID_ARGUMENT, "rule printable-text"),
        ("a terminal escape in the agent version", node_a, {"node_id": "node-a", "agent_version": "1\x1b[8m"},
         grpc.StatusCode.INVALID_ARGUMENT, "rule printable-text"),
        ("an address outside the certificate", node_a, {"node_id": "node-a", "address": "169.254.169.254:80"},
         grpc.StatusCode.PERMISSION_DENIED, "rule address-in-certificate"),
    ]
    for what, tls, fields, code, rule in probes:
        got = register(target, tls, **fields)
        assert got == code, f"{what}: {got}"
        assert rule in register.details, f"{what}: {register.details}"  # type: ignore[attr-defined]
    assert stored_nodes(etcd) == []

    # The same certificate registering honestly is accepted: the refusals above were the rules.
    assert register(target, node_a, node_id="node-a", address="127.0.0.1:7001", labels={"zone": "secure"},
                    capabilities={"cpu_millicores": 4000, "memory_mb": 8192}) == grpc.StatusCode.OK
    assert stored_nodes(etcd) == ["/persys/nodes/node-a"]
    # Operators may set what the node may not.
    c.ctl("label", "node", "node-a", "persys.dev/secure=true")
    node = json.loads(c.ctl("get", "nodes", "node-a", "-o", "json").stdout)
    assert node["labels"]["persys.dev/secure"] == "true"


def test_watch_streams_per_node_are_bounded(cluster: tuple[Components, EtcdServer], tmp_path: Path) -> None:
    c, _ = cluster
    node_a = issue_node(c.pki, tmp_path / "machine-a", "node-a")
    target = c.replica_targets[0]
    assert register(target, node_a, node_id="node-a") == grpc.StatusCode.OK

    async def run() -> list[grpc.StatusCode | None]:
        async with secure_channel(target, node_a, expect=peer_names.SCHEDULER) as ch:
            stub = pb_grpc.AgentControlStub(ch)
            calls: list[Any] = []
            codes: list[grpc.StatusCode | None] = []
            for _ in range(5):  # one after the other: the server counts them in this order
                call = stub.WatchAssignments(pb.WatchAssignmentsRequest(node_id="node-a"))
                try:
                    await call.read()  # the first full set: the stream is open and counted
                    calls.append(call)
                    codes.append(None)
                except grpc.aio.AioRpcError as err:
                    assert "at most 4" in (err.details() or "")
                    codes.append(err.code())
            for call in calls:
                call.cancel()
            # The slots are given back when streams end: a new one opens again.
            await open_when_free(stub)
            return codes

    assert asyncio.run(run()) == [None, None, None, None, grpc.StatusCode.RESOURCE_EXHAUSTED]


async def open_when_free(stub: pb_grpc.AgentControlStub) -> None:
    """Cancelled streams give their slot back once the server notices: retry until one opens."""
    for _ in range(200):
        call = stub.WatchAssignments(pb.WatchAssignmentsRequest(node_id="node-a"))
        try:
            await call.read()
            call.cancel()
            return
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
        await asyncio.sleep(0.1)
    raise AssertionError("no watch slot came back")


class FakeScheduler(pb_grpc.AgentControlServicer):
    """An AgentControl that accepts every registration and remembers it: what a stolen node
    certificate would serve to take over other nodes."""

    def __init__(self) -> None:
        self.registered: list[str] = []

    def RegisterNode(self, request: pb.RegisterNodeRequest, context: grpc.ServicerContext
                     ) -> pb.RegisterNodeResponse:
        self.registered.append(request.node_id)
        return pb.RegisterNodeResponse(accepted=True, heartbeat_interval_seconds=1, report_interval_seconds=1,
                                       node_grace_seconds=10)


def serve_fake(identity: TLSFiles) -> tuple[grpc.Server, int, FakeScheduler]:
    ca, cert, key = identity.read()
    fake = FakeScheduler()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_AgentControlServicer_to_server(fake, server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                                                             require_client_auth=True))
    server.start()
    return server, port, fake


@pytest.mark.parametrize("served_with, registers", [("node-a", False), ("scheduler", True)])
def test_agent_registers_only_with_a_scheduler_identity(tmp_path: Path, served_with: str, registers: bool) -> None:
    pki = tmp_path / "pki"
    subprocess.run(persys("certs", "init", "--dir", str(pki), "--node", "node-a"), check=True, capture_output=True,
                   timeout=60)
    machine_b = tmp_path / "machine-b"
    issue_node(pki, machine_b, "node-b")
    identity = own(pki, "node-node-a" if served_with == "node-a" else "scheduler")
    server, port, fake = serve_fake(identity)
    agent = Proc("agent-node-b", persys("agent", "--scheduler", f"127.0.0.1:{port}", "--node-id", "node-b",
                                         "--tls-dir", str(machine_b), "--state-dir", str(tmp_path / "agent-b"),
                                         "--listen", "127.0.0.1:0"), tmp_path)
    try:
        if registers:  # the control: the same agent and fake register when the peer is a scheduler
            eventually(lambda: fake.registered or None, timeout=60, what="registration at the fake")
            assert fake.registered[0] == "node-b"
        else:  # refused during the handshake, again and again, never reaching the fake
            eventually(lambda: agent.text().count("registration failed") >= 2 or None, timeout=60,
                       what="two refused registrations")
            assert fake.registered == []
    finally:
        agent.stop()
        server.stop(grace=None)
