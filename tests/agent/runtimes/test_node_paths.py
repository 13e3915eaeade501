"""The agent's own re-check of node paths (defence in depth behind the scheduler's policy): the
runtimes an agent builds refuse a compose `path`, a VM image or a microVM kernel/rootfs outside
its node paths, whatever the scheduler sent, without reading the file. Real runtimes on the real
Docker engine and libvirtd."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from persys.agent.runtimes.base import Runtime, RuntimeFailure, RuntimeWorkload
from persys.agent.runtimes.node_paths import NodePaths
from persys.cli.servers.common import default_runtimes
from persys.model import WorkloadSpec


def test_symlinks_and_dotdot_are_resolved_before_the_check(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "images").mkdir(parents=True)
    (state / "images" / "disk.img").write_bytes(b"x")
    os.symlink("/etc/shadow", state / "images" / "sneaky")
    paths = NodePaths.for_agent(state)
    assert paths.check(str(state / "images" / "disk.img"), "vm image") == state / "images" / "disk.img"
    for bad in (str(state / "images" / "sneaky"), f"{state}/../../../etc/shadow", "/etc/shadow"):
        with pytest.raises(RuntimeFailure) as caught:
            paths.check(bad, "vm image")
        assert caught.value.terminal and caught.value.code == "PolicyViolation"
    extra = NodePaths.for_agent(state, [tmp_path / "extra"])
    assert extra.check(str(tmp_path / "extra" / "k"), "kernel") == tmp_path / "extra" / "k"


def _runtime(tmp_path: Path, name: str) -> Runtime:
    runtimes = default_runtimes(tmp_path / "agent", "guard-node", allow_node_paths=[tmp_path / "kernels"])
    return next(r for r in runtimes if r.name == name)


@pytest.mark.parametrize(("name", "spec", "what"), [
    ("compose", {"type": "compose", "compose": {"path": "/etc/shadow"}}, "compose path"),
    ("compose", {"type": "compose", "compose": {"gitRepo": "file:///etc"}}, "gitRepo"),
    ("compose", {"type": "compose", "compose": {"gitRepo": "ext::sh -c id"}}, "gitRepo"),
    ("microvm", {"type": "microvm", "microvm": {"kernel": "/etc/shadow"}}, "kernel"),
    ("microvm", {"type": "microvm", "microvm": {"kernel": "KERNELS/k", "rootfs": "/etc/shadow"}}, "rootfs"),
    ("vm", {"type": "vm", "vm": {"image": "/etc/shadow"}}, "vm image"),
])
async def test_the_agents_runtimes_refuse_paths_outside_its_node_paths(tmp_path: Path, name: str,
                                                                      spec: dict[str, object], what: str) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k").write_bytes(b"\x7fELF")  # an allowed kernel path: the rootfs is what is refused
    rt = _runtime(tmp_path, name)
    doc = json.loads(json.dumps(spec).replace("KERNELS", str(tmp_path / "kernels")))
    w = RuntimeWorkload(workload_id="guard", revision="r1", generation=1, spec=WorkloadSpec.model_validate(doc))
    try:
        with pytest.raises(RuntimeFailure) as caught:
            await rt.start(w)
        assert caught.value.code == "PolicyViolation" and caught.value.terminal, caught.value
        assert what in str(caught.value) and "saltsalt" not in str(caught.value)
    finally:
        await rt.remove("guard")
        await rt.close()


async def test_a_compose_file_the_scheduler_never_saw_is_checked_by_the_agent(tmp_path: Path) -> None:
    """A `path` source (and a git checkout) reaches the agent unchecked by the scheduler's policy:
    the agent refuses privileged services, host namespaces and extra capabilities in it."""
    app = tmp_path / "agent" / "apps" / "priv"
    app.mkdir(parents=True)
    (app / "compose.yaml").write_text("services:\n  x: {image: persys/busybox:latest, privileged: true, pid: host,"
                                      " cap_add: [SYS_ADMIN]}\n")
    rt = _runtime(tmp_path, "compose")
    w = RuntimeWorkload(workload_id="guard-unseen", revision="r1", generation=1,
                        spec=WorkloadSpec.model_validate({"type": "compose", "compose": {"path": str(app)}}))
    try:
        with pytest.raises(RuntimeFailure) as caught:
            await rt.start(w)
        msg = str(caught.value)
        assert caught.value.code == "PolicyViolation" and caught.value.terminal, msg
        assert "(privileged)" in msg and "(hostNamespaces)" in msg and "(capabilities)" in msg, msg
    finally:
        await rt.remove("guard-unseen")
        await rt.close()
