"""AgentService's logs over real gRPC and mutual TLS (persys.agent.service, the gateway's client
persys.agent_client): a real process runtime with a process printing a line per 0.1 s.
StreamLogs sends what is written after it started and ends when the workload is removed; what a
process's output cannot answer (--service) is refused before any message, on both calls, and
--since with --timestamps is answered from the runtime's notes of when the output appeared."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from persys._pb.persys.v1 import agent_pb2 as apb
from persys.agent.runtimes.base import LogQuery, Runtime, RuntimeWorkload
from persys.agent.runtimes.process import ProcessRuntime
from persys.agent.service import serve
from persys.agent_client import fetch_logs, stream_logs
from persys.model.workload import ProcessSpec, Resources, WorkloadSpec
from persys.security.pki import ClusterCA, standard_identities
from persys.tlsfiles import TLSFiles

TICKER = 'i=0; while true; do echo "tick $i"; i=$((i+1)); sleep 0.1; done'


@dataclass
class Node:
    runtime: ProcessRuntime
    state_dir: Path
    node_id: str = "n1"
    image_max_bytes: int = 1 << 20

    def log_sources(self, workload_id: str) -> tuple[Sequence[Runtime], bool]:
        return [self.runtime], False  # asked only when it knows the instance, as for a stray


@dataclass
class Served:
    address: str
    gateway: TLSFiles
    runtime: ProcessRuntime


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    rt = ProcessRuntime(tmp_path / "runtimes", use_cgroups=False, grace_seconds=1)
    server, port = await serve(Node(rt, tmp_path), "127.0.0.1:0", ids["agent"])
    try:
        yield Served(f"127.0.0.1:{port}", ids["gateway"], rt)
    finally:
        await server.stop(None)
        for wid in await rt.list():
            await rt.remove(wid.workload_id)


async def _ticker(rt: ProcessRuntime) -> str:
    wid = f"t{uuid.uuid4().hex[:8]}"
    spec = WorkloadSpec(type="process", resources=Resources(cpu_millicores=50, memory_mb=16),
                        process=ProcessSpec(command=["/bin/sh", "-c", TICKER]))
    await rt.start(RuntimeWorkload(workload_id=wid, revision="r1", generation=1, spec=spec))
    return wid


async def test_stream_sends_new_lines_and_ends_when_the_workload_is_removed(served: Served) -> None:
    wid = await _ticker(served.runtime)
    stream = stream_logs(served.address, served.gateway, apb.LogsRequest(instance_id=wid, tail=0), node_id="n1")
    assert await asyncio.wait_for(anext(stream), 10) == ""  # accepted
    seen = ""
    while len(re.findall(r"tick \d+\n", seen)) < 3:
        seen += await asyncio.wait_for(anext(stream), 10)
    ticks = [int(n) for n in re.findall(r"tick (\d+)\n", seen)]
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))  # in order, none lost
    await served.runtime.remove(wid)

    async def rest() -> None:
        async for _ in stream:
            pass

    await asyncio.wait_for(rest(), 10)  # the stream ends by itself


async def test_what_process_output_cannot_answer_is_refused_first(served: Served) -> None:
    wid = await _ticker(served.runtime)
    request = apb.LogsRequest(instance_id=wid, tail=5, service="db")
    stream = stream_logs(served.address, served.gateway, request, node_id="n1")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(anext(stream), 10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "compose service" in str(err.value.details())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fetch_logs(served.address, served.gateway, request, node_id="n1")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    text = await fetch_logs(served.address, served.gateway, apb.LogsRequest(instance_id=wid, tail=2), node_id="n1")
    assert len(text.splitlines()) == 2


async def test_since_and_timestamps_for_process_output(served: Served) -> None:
    import time

    from persys.agent.runtimes.log_times import read_notes
    from persys.agent.runtimes.supervision import wait_until

    wid = await _ticker(served.runtime)
    log = served.runtime._wdir(wid) / "stdout.log"
    await served.runtime.list()  # the agent lists every pass: that keeps the runtime's log clock running
    assert await wait_until(lambda: len(read_notes(log)) >= 3, within=15)  # three notes of growth, a second apart
    since = read_notes(log)[-1][1]
    request = apb.LogsRequest(instance_id=wid, since=since, timestamps=True)
    text = await fetch_logs(served.address, served.gateway, request, node_id="n1")
    first_tick = int(re.findall(r"tick (\d+)", text)[0])
    everything = await fetch_logs(served.address, served.gateway, apb.LogsRequest(instance_id=wid, tail=100_000),
                                  node_id="n1")
    assert first_tick > 0 and f"tick {first_tick - 1}\n" in everything  # earlier ticks left out
    stamps = re.findall(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z) tick \d+$", text, re.M)
    assert stamps and len(stamps) == len(text.splitlines()) and stamps == sorted(stamps)
    import datetime as dt

    first = dt.datetime.fromisoformat(stamps[0].replace("Z", "+00:00")[:26] + "+00:00").timestamp()
    assert since - 0.001 <= first <= time.time()  # never earlier than asked (the notes keep milliseconds)


async def test_an_unknown_instance_is_not_found(served: Served) -> None:
    stream = stream_logs(served.address, served.gateway, apb.LogsRequest(instance_id="ghost"), node_id="n1")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(anext(stream), 10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


class Counting:
    """The process runtime, counting the bytes its log stream hands to the service."""

    def __init__(self, inner: ProcessRuntime) -> None:
        self.inner, self.name, self.sent = inner, inner.name, 0

    async def inspect(self, workload_id: str) -> object:
        return await self.inner.inspect(workload_id)

    async def stream_logs(self, workload_id: str, query: LogQuery) -> AsyncIterator[str]:
        async for piece in self.inner.stream_logs(workload_id, query):
            self.sent += len(piece)
            yield piece


async def test_a_reader_that_stops_reading_stops_the_agent_reading(tmp_path: Path) -> None:
    """50 MB are written while the client reads nothing: flow control holds the agent back (it
    reads what the HTTP/2 windows take, a few MB at most), instead of it queueing the file."""
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    rt = ProcessRuntime(tmp_path / "runtimes", use_cgroups=False, grace_seconds=1)
    counting = Counting(rt)
    node = Node(rt, tmp_path)
    node.log_sources = lambda _wid: ([counting], False)  # type: ignore[method-assign,assignment,return-value]
    server, port = await serve(node, "127.0.0.1:0", ids["agent"])
    spec = WorkloadSpec(type="process", resources=Resources(cpu_millicores=50, memory_mb=16),
                        process=ProcessSpec(command=["/bin/sh", "-c", "echo started; sleep 600"]))
    wid = f"t{uuid.uuid4().hex[:8]}"
    await rt.start(RuntimeWorkload(workload_id=wid, revision="r1", generation=1, spec=spec))
    try:
        stream = stream_logs(f"127.0.0.1:{port}", ids["gateway"], apb.LogsRequest(instance_id=wid, tail=1),
                             node_id="n1")
        assert await asyncio.wait_for(anext(stream), 10) == ""
        assert "started" in await asyncio.wait_for(anext(stream), 10)
        total = 50 * 1024 * 1024
        line = b"x" * 1023 + b"\n"
        await asyncio.to_thread(_append, tmp_path / "runtimes" / "process" / wid / "stdout.log", line, total)
        await asyncio.sleep(3)  # time enough to read it all, were nothing holding the agent back
        held_back = counting.sent
        assert held_back < total // 5, held_back
        got = 0
        while got < total:  # reading again resumes it: everything arrives
            got += len(await asyncio.wait_for(anext(stream), 10))
        assert got == total
        await stream.aclose()
    finally:
        await server.stop(None)
        await rt.remove(wid)


def _append(path: Path, line: bytes, total: int) -> None:
    with open(path, "ab") as f:
        for _ in range(total // len(line)):
            f.write(line)
