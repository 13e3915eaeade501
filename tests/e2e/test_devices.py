"""GPUs end to end on `persys dev`: the agent detects them (a fake `nvidia-smi` on PATH is the
only stand-in: this machine has no GPU), the node advertises them, a workload asking for one is
placed with a device id that its assignment carries to the agent and on to Docker (which, having
no NVIDIA runtime here, answers for exactly that request), a second finds none free and says
so with figures, and its Pending decision replays identically (`explain --at`)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.docker_fixtures import DockerEngine
from tests.e2e.harness import Proc, ctl, eventually, persys

pytestmark = pytest.mark.e2e

GPU = "GPU-6a1b2c3d-0000-4000-8000-00000000cafe"
# Stands in for the NVIDIA driver's tool: answers the agent's query the way nvidia-smi does.
FAKE_SMI = f"""#!/bin/sh
case "$*" in
  *--query-gpu=index,uuid,name,memory.total*--format=csv,noheader,nounits*)
    echo "0, {GPU}, NVIDIA Fake T4, 15360";;
  *) echo "fake nvidia-smi: unsupported arguments: $*" >&2; exit 2;;
esac
"""
NODES = "nodes:\n  - {name: gpu-node, runtimes: [container, process]}\n"


def manifest(name: str, image: str) -> str:
    return f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: {name}}}
spec:
  type: container
  resources: {{cpuMillicores: 100, memoryMb: 64, devices: [{{vendor: nvidia, count: 1, minMemoryMiB: 8000}}]}}
  container: {{image: {image}, command: [sleep, "3600"]}}
"""


def test_a_gpu_is_detected_placed_reserved_and_handed_to_docker(tmp_path: Path, docker_engine: DockerEngine) -> None:
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    (tmp_path / "nodes.yaml").write_text(NODES)
    env = {"PERSYS_HOME": str(home)}
    dev = Proc("dev", persys("dev", "--port", "0", "--nodes", str(tmp_path / "nodes.yaml")), tmp_path,
               env={**env, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    first, second = docker_engine.workload_id("gpu-a"), docker_engine.workload_id("gpu-b")
    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=60)
        node = json.loads(ctl("get", "nodes", "gpu-node", "-o", "json", env=env).stdout)
        (gpu,) = node["capabilities"]["devices"]
        assert gpu == {"id": GPU, "vendor": "nvidia", "model": "NVIDIA Fake T4", "memoryMb": 15360, "index": 0}

        ctl("apply", "-f", "-", env=env, stdin=manifest(first, docker_engine.image))

        def given() -> list[str] | None:
            w = json.loads(ctl("get", "workloads", first, "-o", "json", env=env).stdout)
            inst = w["instances"][0]
            return inst["placement"].get("devices") if inst["node"] == "gpu-node" else None

        devices, took = eventually(given, 60, f"{first} placed with a device")
        assert devices == [GPU]
        # The agent gave Docker exactly that device: the engine, lacking the NVIDIA runtime, refuses it by name.
        def refused() -> str | None:
            w = json.loads(ctl("get", "workloads", first, "-o", "json", env=env).stdout)
            message = w["instances"][0]["message"]
            return message if 'could not select device driver "nvidia"' in message else None

        message, took_docker = eventually(refused, 60, "Docker answering for the GPU request")
        print(f"placed with {GPU} in {took:.1f}s; Docker's answer after {took_docker:.1f}s: {message}")

        ctl("apply", "-f", "-", env=env, stdin=manifest(second, docker_engine.image))

        def pending() -> dict[str, object] | None:
            w = json.loads(ctl("get", "workloads", second, "-o", "json", env=env).stdout)
            inst = w["instances"][0]
            return inst if inst["reason"] == "Unschedulable" else None

        inst, _ = eventually(pending, 60, f"{second} Pending: the only GPU is taken")
        assert "1 insufficient nvidia.com/gpu with >= 8000 MiB (needs 1 nvidia.com/gpu, best node has 0 " \
               "nvidia.com/gpu free)" in str(inst["message"]), inst
        explained = ctl("explain", second, env=env).stdout
        assert "node has 0 nvidia.com/gpu free, short by 1 nvidia.com/gpu" in explained, explained
        rev = json.loads(ctl("explain", second, "-o", "json", env=env).stdout)["replicas"][0]["decision"]["seen"]["rev"]
        replayed = json.loads(ctl("explain", second, "--at", str(rev), "-o", "json", env=env).stdout)
        assert replayed["agrees"], replayed
        assert "replay agrees" in ctl("explain", second, "--at", str(rev), env=env).stdout
        missing = ctl("explain", second, "--at", "1", env=env, check=False)
        assert missing.returncode != 0 and f"no decision of workload {second} was taken at revision 1" in \
            missing.stderr, missing.stderr
    finally:
        for name in (first, second):
            ctl("delete", "workload", name, env=env, check=False)
        dev.stop(signal.SIGINT)
