"""Chaos: the agent's local state file (agent.db) is corrupt when the agent process starts.

The file is only a cache of what the scheduler says and what runs on the node, so the agent
moves it aside, starts, and adopts the workload that kept running without restarting it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from tests.e2e.harness import Components, eventually, pid_alive, process_manifest


def _bad_header(db: Path) -> None:
    with db.open("r+b") as f:
        f.write(b"not a database!!")


def _half_truncated(db: Path) -> None:
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.truncate(size // 2)


def test_corrupt_agent_db_is_moved_aside_and_workloads_adopted(tmp_path: Path) -> None:
    # A node grace longer than an agent restart on a busy machine: this test is about the agent's
    # own state, not node loss (an agent back after the grace finds its workload moved away).
    c = Components(tmp_path, f"sqlite:///{tmp_path / 'state.db'}", scheduler_args=("--node-grace", "90"))
    agent = c.agents["n1"]
    db = tmp_path / "agent-n1" / "agent.db"
    pid = 0
    try:
        c.ctl("apply", "-f", "-", stdin=process_manifest("keep"))
        w, _ = eventually(lambda: (w := c.workload("keep"))["phase"] == "Running" and w, 30, "keep Running")
        pid = int(w["runtimeId"])
        for round_, corrupt in enumerate((_bad_header, _half_truncated), start=1):
            agent.stop()
            assert pid_alive(pid), "the workload must outlive its agent"
            assert db.stat().st_size > 0
            corrupt(db)
            agent.start()
            agent.wait_for("agent n1 started", timeout=30)
            assert "is unreadable" in agent.text() and "agent.db.corrupt-" in agent.text()
            kept = [p for p in db.parent.glob("agent.db.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
            assert len(kept) == round_, kept  # each bad file kept for inspection
            # The new agent reports again (on a busy machine the node may be NotReady meanwhile
            # and the workload's runtime id empty until it does), then several reconcile passes:
            # a duplicate would show by then.
            eventually(lambda: (w := c.workload("keep"))["phase"] == "Running" and w["runtimeId"] and w, 90,
                       "keep Running and reported by the new agent")
            time.sleep(3)
            after = c.workload("keep")
            assert int(after["runtimeId"]) == pid and after["restarts"] == 0 and after["phase"] == "Running"
            assert pid_alive(pid), "adopted, not restarted"
    finally:
        with contextlib.suppress(Exception):  # a dead agent never confirms: the kill below still runs
            c.ctl("delete", "workload", "keep", check=False)  # waits until the agent stopped it
        c.stop()
        if pid and pid_alive(pid):  # the delete failed: do not leave the process behind
            os.killpg(pid, signal.SIGKILL)
