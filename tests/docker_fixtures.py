"""Session fixture giving tests a real Docker engine and the locally built persys/busybox image.

tests/conftest.py star-imports this module, so `docker_engine` is available everywhere. Everything a
test run creates carries the label `persys.test-run=<run id>`, and only that is cleaned up, so
parallel runs and real agent containers on the same host are left alone.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["BUSYBOX_IMAGE", "TEST_RUN_LABEL", "DockerEngine", "docker_engine"]

REPO = Path(__file__).resolve().parents[1]
START_DOCKERD = REPO / "scripts" / "start-dockerd.sh"
BUILD_BUSYBOX = REPO / "examples" / "images" / "build-busybox.sh"
BUSYBOX_IMAGE = "persys/busybox:latest"
TEST_RUN_LABEL = "persys.test-run"


@dataclass
class DockerEngine:
    run_id: str
    image: str = BUSYBOX_IMAGE
    labels: dict[str, str] = field(default_factory=dict)

    def workload_id(self, name: str) -> str:
        """A workload id unique to this test run (container names must not collide across runs)."""
        return f"t{self.run_id}-{name}"


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}")


def remove_containers(label: str) -> None:
    """Remove every container carrying `label` (key=value), running or not."""
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=60)


def _cleanup(run_id: str) -> None:
    remove_containers(f"{TEST_RUN_LABEL}={run_id}")


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    if shutil.which("docker") is None or not (Path("/usr/sbin/dockerd").exists() or shutil.which("dockerd")):
        pytest.skip("Docker is not installed (no docker CLI / dockerd binary)")
    _run(["bash", str(START_DOCKERD)], "scripts/start-dockerd.sh")
    _run(["bash", str(BUILD_BUSYBOX), BUSYBOX_IMAGE], "examples/images/build-busybox.sh")
    run_id = uuid.uuid4().hex[:8]
    engine = DockerEngine(run_id=run_id, labels={TEST_RUN_LABEL: run_id})
    try:
        yield engine
    finally:
        _cleanup(run_id)
