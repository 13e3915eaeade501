"""Why a runtime is unavailable reaches the node's document: the agent's probe of a real Docker
runtime pointed at a socket where no engine listens, the reason in its registration, bounded by
the scheduler (scheduler.node_admission.unavailable_runtimes), shown by `describe node`."""

from __future__ import annotations

from pathlib import Path

from persys.agent.agent import Agent, AgentConfig
from persys.agent.runtimes.docker import DockerRuntime
from persys.cli.output.describe_text import node_text
from persys.model import Node
from persys.model.node import Capabilities
from persys.scheduler.access.node_admission import unavailable_runtimes


async def test_an_unavailable_runtime_s_reason_reaches_describe_node(tmp_path: Path) -> None:
    docker = DockerRuntime(f"unix://{tmp_path / 'no-engine.sock'}")
    agent = Agent(AgentConfig(node_id="n1", scheduler="a", state_dir=tmp_path / "agent"), [docker])
    try:
        assert await agent.probe_runtimes() is True  # the first probe: what it found differs from nothing
        reason = agent.unavailable["container"]
        assert reason.startswith("docker engine not reachable") and "no-engine.sock" in reason
        sent = dict(agent.register_request().capabilities.unavailable_runtimes)
        assert sent == {"container": reason}
        assert await agent.probe_runtimes() is False  # the same runtimes broken: no new registration
    finally:
        await docker.close()
        agent.local.close()
    kept = unavailable_runtimes(sent)
    assert reason.startswith(kept["container"]) and len(kept["container"]) == min(len(reason), 500)
    node = Node(id="n1", address="10.0.0.1:7001", capabilities=Capabilities(unavailable=kept))
    assert f"  unavailable:  container: {kept['container']}" in node_text(node.to_doc())


def test_what_a_node_says_about_its_runtimes_is_bounded() -> None:
    kept = unavailable_runtimes({**{f"rt{i:02d}": "x" * 1000 for i in range(40)}, "": "no name", "n" * 33: "long"})
    assert len(kept) == 16 and set(kept) == {f"rt{i:02d}" for i in range(16)}
    assert all(len(v) == 500 for v in kept.values())
