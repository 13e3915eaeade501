"""DockerRuntime against a real engine (started by scripts/start-dockerd.sh) and a local image."""

from __future__ import annotations

import asyncio
import functools
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import docker
import pytest

from persys.agent.runtimes.base import RuntimeFailure, RuntimeState, RuntimeWorkload
from persys.agent.runtimes.docker import DockerRuntime, container_name
from persys.model.workload import ContainerSpec, PortMapping, PullPolicy, Resources, WorkloadSpec
from tests.waiting import settled

pytestmark = pytest.mark.docker


@pytest.fixture
def engine(docker_engine: Any) -> Any:
    return docker_engine


@pytest.fixture
async def rt(engine: Any) -> AsyncIterator[DockerRuntime]:
    r = DockerRuntime(stop_timeout=1, extra_labels=engine.labels)
    yield r
    await r.close()


@pytest.fixture(scope="module")
def client() -> Any:
    c = docker.from_env()
    yield c
    c.close()


def workload(
    wid: str,
    image: str,
    command: list[str],
    revision: str = "r1",
    generation: int = 1,
    ports: list[PortMapping] | None = None,
    pull_policy: PullPolicy | None = None,
) -> RuntimeWorkload:
    spec = WorkloadSpec(
        type="container",
        resources=Resources(cpu_millicores=250, memory_mb=32),
        container=ContainerSpec(image=image, command=command, env={"GREETING": "hi"}, ports=ports or [],
                                pull_policy=pull_policy),
    )
    return RuntimeWorkload(workload_id=wid, revision=revision, generation=generation, spec=spec)


wait_for = functools.partial(settled, interval=0.1)


async def test_probe(rt: DockerRuntime) -> None:
    p = await rt.probe()
    assert p.available, p.reason
    assert p.version and "init" in p.features


async def test_start_applies_limits_and_adopts(rt: DockerRuntime, engine: Any, client: Any) -> None:
    wid = engine.workload_id("limits")
    w = workload(wid, engine.image, ["sleep", "300"])
    obs = await rt.start(w)
    assert obs.state is RuntimeState.RUNNING and obs.workload_id == wid and obs.revision == "r1"

    info = client.api.inspect_container(container_name(wid))
    host = info["HostConfig"]
    assert host["NanoCpus"] == 250_000_000
    assert host["Memory"] == 32 * 1024 * 1024
    assert host["Init"] is True
    assert host["RestartPolicy"]["Name"] == "no"
    assert info["Config"]["Labels"]["persys.managed"] == "true"
    assert info["Config"]["Labels"]["persys.generation"] == "1"
    assert "GREETING=hi" in info["Config"]["Env"]
    started = info["State"]["StartedAt"]

    # Same id + revision again: adopted, not restarted.
    again = await rt.start(w)
    assert again.runtime_id == obs.runtime_id
    assert client.api.inspect_container(obs.runtime_id)["State"]["StartedAt"] == started

    # A new runtime instance (restarted agent) finds and adopts it.
    rt2 = DockerRuntime(stop_timeout=1, extra_labels=engine.labels)
    try:
        listed = {o.workload_id: o for o in await rt2.list()}
        assert listed[wid].runtime_id == obs.runtime_id
        assert listed[wid].state is RuntimeState.RUNNING
        adopted = await rt2.start(w)
        assert adopted.runtime_id == obs.runtime_id
        assert client.api.inspect_container(obs.runtime_id)["State"]["StartedAt"] == started
    finally:
        await rt2.close()

    await rt.remove(wid)
    assert await rt.inspect(wid) is None


async def test_new_revision_replaces(rt: DockerRuntime, engine: Any, client: Any) -> None:
    wid = engine.workload_id("rev")
    first = await rt.start(workload(wid, engine.image, ["sleep", "300"], revision="a"))
    second = await rt.start(workload(wid, engine.image, ["sleep", "301"], revision="b", generation=2))
    assert second.runtime_id != first.runtime_id
    assert second.revision == "b" and second.generation == 2 and second.state is RuntimeState.RUNNING
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_container(first.runtime_id)
    await rt.remove(wid)


async def test_stop_then_remove_idempotent(rt: DockerRuntime, engine: Any, client: Any) -> None:
    wid = engine.workload_id("stop")
    obs = await rt.start(workload(wid, engine.image, ["sleep", "300"]))
    t0 = time.monotonic()
    await rt.stop(wid)
    assert time.monotonic() - t0 < 5  # tini forwards SIGTERM; no waiting for the kill timeout
    stopped = await rt.inspect(wid)
    assert stopped is not None and stopped.state is RuntimeState.STOPPED
    assert not client.api.inspect_container(obs.runtime_id)["State"]["Running"]
    await rt.stop(wid)  # idempotent
    await rt.remove(wid)
    await rt.remove(wid)  # idempotent
    assert await rt.inspect(wid) is None
    assert wid not in {o.workload_id for o in await rt.list()}
    await rt.stop("never-existed")


async def test_missing_image_is_terminal(rt: DockerRuntime, engine: Any) -> None:
    wid = engine.workload_id("noimage")
    with pytest.raises(RuntimeFailure) as ei:
        await rt.start(workload(wid, "persys/does-not-exist:1.0", ["true"], pull_policy=PullPolicy.NEVER))
    assert ei.value.code == "ImageNotFound" and ei.value.terminal and "pullPolicy is Never" in str(ei.value)
    assert await rt.inspect(wid) is None


async def test_stats_and_logs(rt: DockerRuntime, engine: Any) -> None:
    wid = engine.workload_id("stats")
    await rt.start(workload(wid, engine.image, ["sh", "-c", "echo hello-$GREETING; exec sleep 300"]))
    obs = await rt.inspect(wid)
    assert obs is not None and obs.state is RuntimeState.RUNNING
    assert obs.usage.memory_bytes > 0
    assert obs.usage.cpu_percent >= 0.0
    logs = await wait_for(lambda: rt.logs(wid, tail=10))
    assert "hello-hi" in logs
    await rt.remove(wid)


async def test_exit_code_reported(rt: DockerRuntime, engine: Any) -> None:
    wid = engine.workload_id("exit3")
    await rt.start(workload(wid, engine.image, ["sh", "-c", "echo bye; exit 3"]))

    async def finished() -> Any:
        o = await rt.inspect(wid)
        return o if o is not None and o.state is not RuntimeState.RUNNING else None

    obs = await wait_for(finished)
    assert obs is not None and obs.state is RuntimeState.FAILED and obs.exit_code == 3
    assert "bye" in await rt.logs(wid)
    # Starting the same revision again after it exited runs it again (the agent's restart).
    again = await rt.start(workload(wid, engine.image, ["sh", "-c", "echo bye; exit 3"]))
    assert again.runtime_id != obs.runtime_id
    await rt.remove(wid)


async def test_published_port_serves(rt: DockerRuntime, engine: Any, client: Any) -> None:
    wid = engine.workload_id("httpd")
    port = PortMapping(container_port=8080, host_port=0, host_ip="127.0.0.1")
    await rt.start(workload(wid, engine.image, ["httpd", "-f", "-p", "8080", "-h", "/var/www"], ports=[port]))
    binding = client.api.inspect_container(container_name(wid))["NetworkSettings"]["Ports"]["8080/tcp"][0]
    assert binding["HostIp"] == "127.0.0.1"
    url = f"http://127.0.0.1:{binding['HostPort']}/index.html"

    async def fetch() -> str:
        try:
            return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=1).read().decode())
        except OSError:
            return ""

    assert "hello from persys/busybox" in await wait_for(fetch)
    await rt.remove(wid)


async def test_port_conflict_is_terminal(rt: DockerRuntime, engine: Any) -> None:
    a, b = engine.workload_id("porta"), engine.workload_id("portb")
    port = PortMapping(container_port=8080, host_port=18080 + int(engine.run_id[:3], 16) % 1000)
    await rt.start(workload(a, engine.image, ["sleep", "300"], ports=[port]))
    try:
        with pytest.raises(RuntimeFailure) as ei:
            await rt.start(workload(b, engine.image, ["sleep", "300"], ports=[port]))
        assert ei.value.code == "PortConflict" and ei.value.terminal
        assert await rt.inspect(b) is None  # the half-created container was cleaned up
    finally:
        await rt.remove(a)


async def test_two_clusters_with_the_same_node_name_keep_apart(engine: Any, client: Any) -> None:
    """Two clusters on one engine (two `persys dev`: both nodes are `dev-node`): each runs its own
    container of the same instance (`persys-<cluster>-<node>-<id>`), lists only its own, and
    removing one leaves the other running; this cluster's container from before cluster ids (no
    cluster label) is adopted, the other cluster's never."""
    wid = engine.workload_id("twin")
    one = DockerRuntime(stop_timeout=1, extra_labels={**engine.labels, "persys.node": "dev-node",
                                                      "persys.cluster": "c0ffee01"})
    two = DockerRuntime(stop_timeout=1, extra_labels={**engine.labels, "persys.node": "dev-node",
                                                      "persys.cluster": "c0ffee02"})
    w = workload(wid, engine.image, ["sleep", "300"])
    try:
        a, b = await one.start(w), await two.start(w)
        assert a.runtime_id != b.runtime_id
        assert client.api.inspect_container(container_name(wid, "dev-node", "c0ffee01"))["Id"] == a.runtime_id
        assert [o.runtime_id for o in await one.list() if o.workload_id == wid] == [a.runtime_id]
        assert [o.runtime_id for o in await two.list() if o.workload_id == wid] == [b.runtime_id]
        await two.remove(wid)
        assert client.api.inspect_container(a.runtime_id)["State"]["Running"]  # the other cluster's untouched
        assert await two.inspect(wid) is None
        await one.remove(wid)
        legacy = client.containers.run(engine.image, ["sleep", "300"], name=container_name(wid, "dev-node"),
                                       detach=True, labels={**engine.labels, "persys.node": "dev-node",
                                                            "persys.managed": "true", "persys.workload": wid,
                                                            "persys.revision": "r1", "persys.generation": "1"})
        assert [o.runtime_id for o in await one.list() if o.workload_id == wid] == [legacy.id]
        assert (await one.start(w)).runtime_id == legacy.id  # adopted, not duplicated
        await one.remove(wid)
    finally:
        for c in client.containers.list(all=True, filters={"label": f"persys.workload={wid}"}):
            c.remove(force=True)


async def test_two_nodes_on_one_engine_keep_apart_and_old_names_are_adopted(engine: Any, client: Any) -> None:
    """Container names are host-wide: two agents sharing an engine run the same instance id as two
    containers (`persys-<node>-<id>`), neither adopting nor removing the other's; a container named
    as before names carried the node (`persys-<id>`, with this node's label) is adopted."""
    wid = engine.workload_id("shared")
    a = DockerRuntime(stop_timeout=1, extra_labels={**engine.labels, "persys.node": "node-a"})
    b = DockerRuntime(stop_timeout=1, extra_labels={**engine.labels, "persys.node": "node-b"})
    w = workload(wid, engine.image, ["sleep", "300"])
    try:
        on_a = await a.start(w)
        on_b = await b.start(workload(wid, engine.image, ["sleep", "301"], revision="r2"))
        assert on_a.runtime_id != on_b.runtime_id
        assert client.api.inspect_container(container_name(wid, "node-a"))["Id"] == on_a.runtime_id
        assert (await a.inspect(wid)).runtime_id == on_a.runtime_id  # type: ignore[union-attr]
        assert [o.runtime_id for o in await b.list() if o.workload_id == wid] == [on_b.runtime_id]
        await b.remove(wid)
        assert client.api.inspect_container(on_a.runtime_id)["State"]["Running"]  # a's untouched
        await a.remove(wid)
        # An older agent's container (no node in its name) is adopted, not duplicated.
        legacy = client.containers.run(engine.image, ["sleep", "300"], name=container_name(wid), detach=True,
                                       labels={**engine.labels, "persys.node": "node-a", "persys.managed": "true",
                                               "persys.workload": wid, "persys.revision": "r1",
                                               "persys.generation": "1"})
        assert (await a.start(w)).runtime_id == legacy.id
        await a.remove(wid)
        assert client.containers.list(all=True, filters={"name": wid}) == []
    finally:
        for c in client.containers.list(all=True, filters={"label": f"persys.workload={wid}"}):
            c.remove(force=True)
        await a.close()
        await b.close()
