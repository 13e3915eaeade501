"""Starting in any order (issue #31): a scheduler whose etcd is unreachable at start used to exit
with a traceback; it starts frozen (degraded), answers Health at once from memory, and thaws
when etcd comes, then schedules. Real etcd (stopped, then started on its port), scheduler and
agent as OS processes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.harness import eventually, stop_node_guards
from tests.e2e.test_chaos_disconnect import Cluster, copy_pid, manifest
from tests.fixtures_infra import start_etcd

pytestmark = pytest.mark.e2e


def test_scheduler_started_without_its_store_starts_frozen_and_thaws(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    etcd.stop()  # its port is known; nothing answers there
    cluster: Cluster | None = None
    try:
        cluster = c = Cluster(tmp_path, etcd.url)  # waits for "scheduler ready": it did not exit
        assert c.procs[0].alive()
        started = time.monotonic()
        h = c.call(lambda cl: cl.health())
        assert time.monotonic() - started < 2.0, "Health waited on the unreachable store"
        assert h["mode"] == "degraded" and not h["storeOk"], h
        assert "unreachable at start" in h["detail"]
        etcd.start()
        eventually(lambda: (h := c.call(lambda cl: cl.health()))["mode"] == "normal" and h["active"], 60,
                   "normal and active once etcd answers")
        c.agent("a", c.target)
        c.call(lambda cl: cl.apply(manifest("after-thaw")))
        eventually(lambda: c.where("after-thaw") == ("Running", "a") and copy_pid(c.dirs["a"], "after-thaw"), 60,
                   "scheduled after the thaw")
        assert "Traceback" not in c.procs[0].text()
    finally:
        if cluster is not None:
            cluster.stop()
        stop_node_guards(tmp_path)
        etcd.stop()
