"""The agent's and the scheduler's state and log files are theirs alone (issue #30, 8): what an
earlier version left (0644 files in 0755 folders) is fixed at start, and what they create is made
so. Real agent state (its SQLite database, a process workload's output), a real `persys
scheduler` process. What belongs to workloads (a folder chowned to a workload's uid, an image's
root filesystem deeper down) keeps its modes."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from persys.agent.agent import Agent, AgentConfig
from persys.agent.runtimes.process import ProcessRuntime
from persys.security.pki import ClusterCA
from tests.agent.runtimes.test_runtime_process import wl
from tests.waiting import ready_then_stopped

NOBODY = 65534


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def make(p: Path, m: int, text: str | None = None) -> Path:
    if text is None:
        p.mkdir(parents=True, exist_ok=True)
    else:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    os.chmod(p, m)
    return p


@pytest.mark.skipif(os.geteuid() != 0, reason="chowns a folder to another uid, as the agent does for workloads")
def test_agent_state_left_open_is_fixed_at_start(tmp_path: Path) -> None:
    state = make(tmp_path / "agent", 0o755)
    db = make(state / "agent.db", 0o644, "")
    proc = make(state / "runtimes" / "process", 0o755)
    log = make(proc / "w1" / "stdout.log", 0o644, "secret output\n")
    meta = make(proc / "w1" / "meta.json", 0o644, "{}")
    work = make(proc / "w1" / "work", 0o755)
    own = make(work / "served.html", 0o644, "the workload's own")
    os.chown(work, NOBODY, NOBODY)
    rootfs_tmp = make(state / "runtimes" / "microvm" / "images" / "x" / "rootfs" / "tmp", 0o1777)
    os.chmod(make(state / "runtimes" / "microvm" / "images", 0o755), 0o755)
    os.chmod(db, 0o644)  # make() of a parent does not touch it; as left by the old agent

    agent = Agent(AgentConfig(node_id="n1", scheduler="a", state_dir=state), [])
    try:
        assert mode(state) == 0o711  # workloads reach their own folders below it by name
        assert mode(db) == 0o600 and mode(log) == 0o600 and mode(meta) == 0o600
        assert mode(proc) == 0o711 and mode(proc / "w1") == 0o711
        assert mode(work) == 0o755 and mode(own) == 0o644  # the workload's: not touched, not entered
        assert mode(rootfs_tmp) == 0o1777  # an image's root filesystem: below the depth, as it was
        for suffix in ("-wal", "-shm"):
            p = Path(f"{db}{suffix}")
            assert not p.exists() or mode(p) == 0o600
    finally:
        agent.local.close()


def test_a_fresh_agent_database_is_0600(tmp_path: Path) -> None:
    agent = Agent(AgentConfig(node_id="n1", scheduler="a", state_dir=tmp_path / "agent"), [])
    try:
        assert mode(tmp_path / "agent" / "agent.db") == 0o600
        assert mode(tmp_path / "agent") & 0o066 == 0
    finally:
        agent.local.close()


async def test_a_process_workloads_output_is_0600(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path, use_cgroups=False, grace_seconds=1.0)
    w = wl(["sh", "-c", "echo hello; sleep 30"])
    try:
        await rt.start(w)
        log = tmp_path / "process" / w.workload_id / "stdout.log"
        assert mode(log) == 0o600
    finally:
        await rt.remove(w.workload_id)
        await rt.close()


def test_persys_scheduler_fixes_its_data_dir_at_start(tmp_path: Path) -> None:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ca.issue("scheduler", "scheduler", ("localhost",))
    data = make(tmp_path / "data", 0o755)
    old = make(data / "backups" / "old.db", 0o644, "state")
    os.chmod(data / "backups", 0o755)
    argv = [sys.executable, "-m", "persys.cli.servers.app", "scheduler", "--listen", "127.0.0.1:0",
            "--tls-dir", str(tmp_path / "pki"), "--data-dir", str(data),
            "--store", f"sqlite://{data}/state.db", "--events", "memory://"]
    ready_then_stopped(argv, tmp_path / "scheduler.log")
    assert mode(data) == 0o700 and mode(data / "backups") == 0o700 and mode(old) == 0o600
    assert mode(data / "secrets.key") == 0o600


def test_an_agent_folder_inside_the_scheduler_folder_is_left_alone(tmp_path: Path) -> None:
    """--data-dir /var/lib/persys on a machine whose agent keeps /var/lib/persys/agent: the agent's
    folder is neither changed nor entered, and the folders on the way keep their search bit."""
    from persys.security.private_files import tighten_tree

    data = make(tmp_path / "persys", 0o755)
    key = make(data / "secrets.key", 0o644, "k")
    agent = make(data / "agent", 0o711)
    make(agent / "agent.db", 0o600, "")
    work = make(agent / "runtimes" / "process" / "w1" / "work", 0o755)
    tighten_tree(data, max_depth=4, leave="agent.db")
    assert mode(key) == 0o600 and mode(data) == 0o711
    assert mode(agent) == 0o711 and mode(work) == 0o755


def test_runtime_logs_are_made_0600(tmp_path: Path) -> None:
    """mark_start opens every runtime log (a process's output, a microVM's console): a new one is
    0600, an old 0644 one becomes 0600, and a link planted in its place is not followed."""
    from persys.agent.runtimes.workdir import mark_start

    new, old = tmp_path / "stdout.log", make(tmp_path / "console.log", 0o644, "earlier boot\n")
    mark_start(new, "starting")
    mark_start(old, "booting")
    assert mode(new) == 0o600 and mode(old) == 0o600
    assert old.read_text().startswith("earlier boot\n--- persys: booting")
    target = make(tmp_path / "elsewhere", 0o644, "x")
    (tmp_path / "planted.log").symlink_to(target)
    with pytest.raises(OSError):
        mark_start(tmp_path / "planted.log", "starting")
    assert target.read_text() == "x" and mode(target) == 0o644
