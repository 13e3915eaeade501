"""An agent's link whose active replica answers late (issue #31: "acknowledged nothing for 6.0s",
then a switch to a replica that refused connections, then NotReady). The link speaks real gRPC
and mTLS to a real scheduler through a TCP proxy that holds every byte for three acknowledgement
deadlines and then delivers it; the link's other replica address refuses connections. It must
stay with the slow active: probing finds nothing better there."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.link import GrpcLink, LinkOptions
from persys.scheduler.rpc.server import RunningScheduler, start_scheduler
from persys.security.pki import ClusterCA, standard_identities
from tests.scheduler.test_core import node
from tests.tcp_proxy import TcpProxy

DEADLINE = 1.0  # the link's acknowledgement deadline (two heartbeats of 0.5 s)
HELD = 3 * DEADLINE


class Node:
    """The least a LinkHandler does: heartbeats, nothing to run."""

    def register_request(self) -> pb.RegisterNodeRequest:
        return pb.RegisterNodeRequest(node_id="n1")

    def heartbeat_request(self) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(node_id="n1")

    async def accept_desired(self, ds: pb.AssignmentSet) -> None:
        return None

    def on_registered(self, resp: pb.RegisterNodeResponse) -> None:
        return None

    def on_heartbeat_answer(self, resp: pb.HeartbeatResponse, sent: float | None) -> None:
        return None

    def on_new_stream(self) -> None:
        return None

    def on_call_failed(self, call: str, err: grpc.aio.AioRpcError) -> None:
        return None


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[tuple[RunningScheduler, ClusterCA]]:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    running = await start_scheduler(f"sqlite:///{tmp_path / 'state.db'}", "memory://", "127.0.0.1:0",
                                    ids["scheduler"])
    await running.scheduler.agent_api.register(node("n1"))
    yield running, ca
    await running.stop()


def refusing_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there


async def test_a_slow_active_is_not_traded_for_a_refusing_address(
        scheduler: tuple[RunningScheduler, ClusterCA], tmp_path: Path) -> None:
    running, ca = scheduler
    proxy = TcpProxy(f"127.0.0.1:{running.port}")
    tls = standard_identities(ca, "n1")["agent"]
    link = GrpcLink("n1", [proxy.address, refusing_address()], tls, Node(),
                    LinkOptions(ack_deadline=DEADLINE, heartbeat_interval=DEADLINE / 2))
    link._connect(proxy.address)
    link.registered.set()  # registered already (above): only the update stream and heartbeats run
    link._unregistered.clear()
    tasks = [asyncio.create_task(link._updates_loop()), asyncio.create_task(link._heartbeat_loop())]
    try:
        deadline = time.monotonic() + 10
        while link.last_ack is None:
            assert time.monotonic() < deadline, "no acknowledgement before the test"
            await asyncio.sleep(0.05)
        proxy.hold()
        held_until = time.monotonic() + HELD
        targets = set()
        while time.monotonic() < held_until:
            targets.add(link.target)
            await asyncio.sleep(0.05)
        acked_before = link.last_ack
        proxy.release()
        deadline = time.monotonic() + 10
        while link.last_ack == acked_before:
            targets.add(link.target)
            assert time.monotonic() < deadline, "no acknowledgement after the replica caught up"
            await asyncio.sleep(0.05)
        assert targets == {proxy.address}, f"the link left the answering replica: {targets}"
        assert link.target == proxy.address
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await link.close()
        proxy.close()
