"""The Docker runtimes' probe says why the engine is unusable, never with an empty reason."""

from __future__ import annotations

from pathlib import Path

from persys.agent.runtimes.compose.runtime import ComposeRuntime
from persys.agent.runtimes.docker import DockerRuntime
from persys.agent.runtimes.docker_client import engine_unreachable


async def test_no_engine_at_the_socket_names_where_and_the_fix(tmp_path: Path) -> None:
    url = f"unix://{tmp_path / 'docker.sock'}"  # nothing listens there
    for runtime in (DockerRuntime(url=url), ComposeRuntime(tmp_path / "rt", url=url)):
        try:
            probe = await runtime.probe()
        finally:
            await runtime.close()
        assert not probe.available
        if "docker engine" in probe.reason:  # compose may first miss its CLI; that reason is its own
            assert url in probe.reason and "start dockerd" in probe.reason, probe.reason


def test_a_timeout_is_never_an_empty_reason() -> None:
    reason = engine_unreachable(TimeoutError(), "unix:///run/d.sock")
    assert reason.startswith("docker engine not reachable at unix:///run/d.sock: no answer within 5 s")
    assert engine_unreachable(OSError(), None).split(": ")[1].startswith("OSError")
