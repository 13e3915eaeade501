"""GPUs given by a placement reach Docker: the container's HostConfig.DeviceRequests (what
`docker run --gpus device=<id>` sends) as `docker inspect` shows it, and a start on an engine
without the NVIDIA runtime fails with a named reason (this machine has no GPU: the engine itself
answering for the request is what proves it got there)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiodocker
import docker
import pytest

from persys.agent.runtimes.base import RuntimeFailure, RuntimeWorkload
from persys.agent.runtimes.docker import DockerRuntime, container_name
from persys.model.workload import ContainerSpec, Resources, WorkloadSpec

pytestmark = pytest.mark.docker

GPU = "GPU-2f3c1d4e-0000-4000-8000-000000000001"


@pytest.fixture
async def rt(docker_engine: Any) -> AsyncIterator[DockerRuntime]:
    r = DockerRuntime(stop_timeout=1, extra_labels=docker_engine.labels)
    yield r
    await r.close()


def gpu_workload(wid: str, image: str) -> RuntimeWorkload:
    spec = WorkloadSpec(type="container", resources=Resources(cpu_millicores=100, memory_mb=32),
                        container=ContainerSpec(image=image, command=["sleep", "60"]))
    return RuntimeWorkload(workload_id=wid, revision="r1", generation=1, spec=spec, devices=(GPU,))


async def test_the_device_request_reaches_docker_inspect(rt: DockerRuntime, docker_engine: Any) -> None:
    wid = docker_engine.workload_id("gpu")
    w = gpu_workload(wid, docker_engine.image)
    assert w.spec.container is not None
    config = rt._config(w, w.spec.container)  # what start creates the container with
    name = container_name(wid)
    async with aiodocker.Docker() as api:
        created = await api.containers.create(config, name=name)
        try:
            info = docker.from_env().api.inspect_container(name)
            (req,) = info["HostConfig"]["DeviceRequests"]
            assert req["Driver"] == "nvidia" and req["DeviceIDs"] == [GPU] and req["Capabilities"] == [["gpu"]]
        finally:
            await created.delete(force=True)


async def test_a_start_without_the_nvidia_runtime_says_so(rt: DockerRuntime, docker_engine: Any) -> None:
    wid = docker_engine.workload_id("gpu-start")
    with pytest.raises(RuntimeFailure) as failed:
        await rt.start(gpu_workload(wid, docker_engine.image))
    assert failed.value.code == "DeviceUnavailable", failed.value
    assert 'could not select device driver "nvidia"' in str(failed.value), failed.value
    assert wid not in [o.workload_id for o in await rt.list()]  # the container that could not start is gone
