"""The agent's two streams over real gRPC and mTLS. Desired state: a full set first, then only
what changed for an agent that asks for deltas; full sets again on request or for agents that do
not. Updates: heartbeats (each acknowledged) and status reports as messages on one stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.model import parse_manifests
from persys.scheduler.errors import NotActive
from persys.scheduler.rpc.server import RunningScheduler, start_scheduler
from persys.security import peer_names
from persys.security.grpc_tls import secure_channel
from persys.security.pki import ClusterCA, standard_identities
from tests.scheduler.test_core import manifest, node


@pytest.fixture
async def sched(tmp_path: Path) -> AsyncIterator[tuple[RunningScheduler, pb_grpc.AgentControlStub]]:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    running = await start_scheduler(f"sqlite:///{tmp_path / 'state.db'}", "memory://", "127.0.0.1:0",
                                    ids["scheduler"])
    await running.scheduler.agent_api.register(node("n1"))
    channel = secure_channel(f"127.0.0.1:{running.port}", ids["agent"], expect=peer_names.SCHEDULER)
    yield running, pb_grpc.AgentControlStub(channel)
    await channel.close()
    await running.stop()


async def next_message(call: grpc.aio.UnaryStreamCall) -> pb.AssignmentSet:  # type: ignore[type-arg]
    msg = await asyncio.wait_for(call.read(), 10)
    assert isinstance(msg, pb.AssignmentSet)
    return msg


async def test_deltas_after_a_full_set(sched: tuple[RunningScheduler, pb_grpc.AgentControlStub]) -> None:
    running, stub = sched
    s = running.scheduler
    deltas = stub.WatchAssignments(pb.WatchAssignmentsRequest(node_id="n1", deltas=True))
    fulls = stub.WatchAssignments(pb.WatchAssignmentsRequest(node_id="n1"))
    first = await next_message(deltas)
    assert first.full and not first.workloads
    assert (await next_message(fulls)).full

    for name in ("a", "b"):
        await s.workload_api.apply(parse_manifests(manifest(name))[0])
        msg = await next_message(deltas)
        while not msg.workloads:  # a wake-up may carry nothing new
            msg = await next_message(deltas)
        assert not msg.full and [w.instance_id for w in msg.workloads] == [name] and not msg.removed
    msg = await next_message(fulls)
    while len(msg.workloads) < 2:
        msg = await next_message(fulls)
    assert msg.full and sorted(w.instance_id for w in msg.workloads) == ["a", "b"]

    await s.workload_api.delete("a")
    msg = await next_message(deltas)
    while not msg.removed:
        msg = await next_message(deltas)
    assert list(msg.removed) == ["a"] and not msg.full

    s.delivery.ask_resync("n1")  # what drift remediation does for a node missing a workload
    msg = await next_message(deltas)
    assert msg.full and [w.instance_id for w in msg.workloads] == ["b"]
    deltas.cancel()
    fulls.cancel()


async def test_heartbeats_and_reports_on_the_update_stream(
        sched: tuple[RunningScheduler, pb_grpc.AgentControlStub]) -> None:
    running, stub = sched
    s = running.scheduler
    await s.workload_api.apply(parse_manifests(manifest("web"))[0])
    for _ in range(100):
        if s.state.placement_of.get("web") == "n1":
            break
        await asyncio.sleep(0.05)
    web = s.state.assignments["n1"]["web"].value

    call = stub.StreamUpdates()
    await call.write(pb.AgentUpdate(heartbeat=pb.HeartbeatRequest(node_id="n1", usage=pb.NodeUsage(workloads=1))))
    ack = await asyncio.wait_for(call.read(), 5)
    assert ack.heartbeat.acknowledged and ack.heartbeat.mode == "normal" and not ack.heartbeat.reregister
    assert s.live["n1"].usage.workloads == 1

    await call.write(pb.AgentUpdate(report=pb.ReportStatusRequest(node_id="n1", complete=True, workloads=[
        pb.WorkloadReport(instance_id="web", revision=web.revision, generation=web.generation,
                          state=pb.WORKLOAD_STATE_RUNNING, runtime_id="pid-1")])))
    await call.write(pb.AgentUpdate(heartbeat=pb.HeartbeatRequest(node_id="n1")))
    await asyncio.wait_for(call.read(), 5)  # answered on receipt: the report is persisted on its own
    for _ in range(100):
        if s.workload_view("web")["phase"] == "Running":
            break
        await asyncio.sleep(0.05)
    assert s.workload_view("web")["phase"] == "Running"

    await call.write(pb.AgentUpdate(heartbeat=pb.HeartbeatRequest(node_id="n2")))  # not this certificate
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(call.read(), 5)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_slow_report_never_delays_a_heartbeat_acknowledgement(
        sched: tuple[RunningScheduler, pb_grpc.AgentControlStub], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #31: the active replica acknowledged a heartbeat only after the report before it was
    written, so agents of a replica with a slow store (or event bus) left it. Reports are now
    persisted in order by their own task; heartbeats are answered on receipt."""
    running, stub = sched
    s = running.scheduler
    release = asyncio.Event()
    persisted: list[bool] = []
    real = s.agent_api.report

    async def slow_report(node_id: str, reports: list, complete: bool, volumes: object = None) -> None:  # type: ignore[type-arg]
        await release.wait()  # a store write that takes as long as the test wants
        await real(node_id, reports, complete, volumes)  # type: ignore[arg-type]
        persisted.append(complete)

    monkeypatch.setattr(s.agent_api, "report", slow_report)
    call = stub.StreamUpdates()
    await call.write(pb.AgentUpdate(report=pb.ReportStatusRequest(node_id="n1", complete=True)))
    await call.write(pb.AgentUpdate(report=pb.ReportStatusRequest(node_id="n1", complete=False)))
    for _ in range(3):
        await call.write(pb.AgentUpdate(heartbeat=pb.HeartbeatRequest(node_id="n1")))
        ack = await asyncio.wait_for(call.read(), 5)  # not held behind the blocked reports
        assert ack.heartbeat.acknowledged
    assert persisted == []
    release.set()
    await call.done_writing()
    assert await asyncio.wait_for(call.read(), 5) == grpc.aio.EOF  # the stream ends once both are written
    assert persisted == [True, False]  # in arrival order


async def test_a_heartbeats_errors_end_the_update_stream_with_their_status(
        sched: tuple[RunningScheduler, pb_grpc.AgentControlStub], monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat's hot path maps errors only when they happen: a usage beyond any host is
    INVALID_ARGUMENT naming the field; a replica that stopped being active ends the stream with
    FAILED_PRECONDITION and the active one's address (the agent follows it); so does a report
    that failed for that reason, at the next heartbeat."""
    running, stub = sched
    s = running.scheduler

    async def stream_error(*updates: pb.AgentUpdate) -> grpc.aio.AioRpcError:
        call = stub.StreamUpdates()
        for u in updates:
            await call.write(u)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            for _ in range(len(updates)):
                await asyncio.wait_for(call.read(), 10)
        return err.value

    beat = pb.AgentUpdate(heartbeat=pb.HeartbeatRequest(node_id="n1"))
    err = await stream_error(pb.AgentUpdate(heartbeat=pb.HeartbeatRequest(
        node_id="n1", usage=pb.NodeUsage(cpu_percent=-1.0))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "usage.cpu_percent" in str(err.details())

    def standby(*_: object) -> bool:
        raise NotActive("10.0.0.9:7000")

    with monkeypatch.context() as m:
        m.setattr(s.agent_api, "heartbeat", standby)
        err = await stream_error(beat)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ("persys-leader", "10.0.0.9:7000") in tuple(err.trailing_metadata() or ())

    async def report_on_standby(*_: object) -> None:
        raise NotActive("10.0.0.9:7000")

    monkeypatch.setattr(s.agent_api, "report", report_on_standby)
    call = stub.StreamUpdates()
    await call.write(pb.AgentUpdate(report=pb.ReportStatusRequest(node_id="n1", complete=True)))
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        for _ in range(200):  # until the report's task has failed: the next heartbeat ends the stream
            await call.write(beat)
            await asyncio.wait_for(call.read(), 10)
            await asyncio.sleep(0.05)
    assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
