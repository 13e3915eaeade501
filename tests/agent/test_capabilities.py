"""Capability detection is re-run: a runtime that breaks is withdrawn, and comes back when fixed.

The Docker engine is real; it is reached through a unix-socket relay the test can cut, which is
how "the daemon stopped answering" is produced without stopping the shared engine."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persys.agent.agent import Agent, AgentConfig
from persys.agent.runtimes.docker import DockerRuntime
from persys.agent.runtimes.process import ProcessRuntime
from persys.model import parse_manifests
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.rpc.server import RunningScheduler, start_scheduler
from persys.security.pki import ClusterCA, standard_identities
from tests.docker_fixtures import remove_containers
from tests.waiting import until


class Relay:
    """Forwards a unix socket to the Docker engine's; `cut()` stops answering."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.server: asyncio.AbstractServer | None = None
        self.conns: set[asyncio.StreamWriter] = set()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        w.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_unix_connection("/var/run/docker.sock")
        self.conns |= {w, uw}
        await asyncio.gather(self._pipe(r, uw), self._pipe(ur, w))

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._handle, path=str(self.path))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.conns:
            w.close()
        self.conns.clear()
        self.path.unlink(missing_ok=True)


@pytest.fixture
async def cluster(tmp_path: Path, docker_engine: object) -> AsyncIterator[tuple[RunningScheduler, Agent, Relay]]:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    sched = await start_scheduler(f"sqlite:///{tmp_path / 'state.db'}", "memory://", "127.0.0.1:0",
                                  ids["scheduler"], SchedulerConfig(monitor_interval_seconds=0.1))
    relay = Relay(tmp_path / "docker.sock")
    await relay.start()
    agent = Agent(
        AgentConfig(node_id="n1", scheduler=f"127.0.0.1:{sched.port}", tls=ids["agent"],
                    state_dir=tmp_path / "agent", probe_interval=0.3),
        [DockerRuntime(url=f"unix://{relay.path}", extra_labels={"persys.node": "cap-test"}),
         ProcessRuntime(tmp_path / "agent" / "runtimes")],
    )
    await agent.start()
    await asyncio.wait_for(agent.registered.wait(), 10)
    try:
        yield sched, agent, relay
    finally:
        await agent.stop()
        await sched.stop()
        # A deleted workload's container may outlive the agent's stop (removal is asynchronous).
        remove_containers("persys.node=cap-test")


async def test_broken_runtime_is_withdrawn_and_restored(cluster: tuple[RunningScheduler, Agent, Relay]) -> None:
    sched, _agent, relay = cluster
    s = sched.scheduler
    caps = lambda: set(s.state.nodes["n1"].value.capabilities.runtimes)  # noqa: E731
    assert caps() == {"container", "process"}
    docker_version = s.state.nodes["n1"].value.capabilities.runtimes["container"].version
    assert docker_version  # advertised with the engine's version

    await relay.cut()
    await until(lambda: caps() == {"process"})
    manifest = """
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: c1}
spec: {type: container, container: {image: persys/busybox:latest, command: [sleep, "60"]}}
"""
    await s.workload_api.apply(parse_manifests(manifest)[0])
    await until(lambda: "c1" in s.state.statuses and s.state.statuses["c1"].value.reason == "Unschedulable")
    assert "no container runtime" in s.state.statuses["c1"].value.message

    await relay.start()
    await until(lambda: caps() == {"container", "process"})
    await until(lambda: s.state.placement_of.get("c1") == "n1")
    await s.workload_api.delete("c1")
    await until(lambda: "c1" not in s.state.workloads, 20)
