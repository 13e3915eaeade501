"""Chaos around the state store: etcd stopped, etcd back with an empty data directory.

Real etcd, scheduler, agent and gateway processes; workloads are real host processes."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Components, eventually, kill_process_workloads, pid_alive, process_manifest
from tests.fixtures_infra import EtcdServer, start_etcd

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Components, EtcdServer]]:
    etcd = start_etcd(tmp_path / "etcd")
    c = Components(tmp_path, etcd.url, agent_args=("--cpu-millicores", "4000"))
    yield c, etcd
    c.stop()
    etcd.stop()
    kill_process_workloads(tmp_path)


def running_pid(c: Components, name: str) -> int:
    w, _ = eventually(lambda: (lambda v: v if v["phase"] == "Running" else None)(c.workload(name)), 15,
                      f"{name} Running")
    return int(w["runtimeId"])


def test_etcd_down_degrades_and_recovers(cluster: tuple[Components, EtcdServer]) -> None:
    c, etcd = cluster
    c.ctl("apply", "-f", "-", stdin=process_manifest("steady"))
    pid = running_pid(c, "steady")

    etcd.stop()
    h, took = eventually(lambda: (lambda h: h if h["mode"] == "degraded" else None)(c.health()), 10, "degraded")
    print(f"degraded detected after {took:.1f}s")
    assert "unreachable" in h["detail"]
    refused = c.ctl("apply", "-f", "-", stdin=process_manifest("new-one"), check=False)
    assert refused.returncode == 1
    assert "degraded" in refused.stderr and "Traceback" not in refused.stderr
    assert c.ctl("get", "workloads").returncode == 0  # reads are served from the last known state
    time.sleep(3)  # several agent passes while frozen
    assert pid_alive(pid), "running workloads keep running while the store is away"

    etcd.start()
    eventually(lambda: c.health()["mode"] == "normal", 15, "back to normal")
    assert c.workload("steady")["phase"] == "Running" and int(c.workload("steady")["runtimeId"]) == pid
    c.ctl("apply", "-f", "-", stdin=process_manifest("new-one"))
    running_pid(c, "new-one")


def test_empty_etcd_enters_recovery_and_restore_brings_everything_back(
    cluster: tuple[Components, EtcdServer], tmp_path: Path
) -> None:
    c, etcd = cluster
    for name in ("keep-a", "keep-b"):
        c.ctl("apply", "-f", "-", stdin=process_manifest(name))
    pids = {name: running_pid(c, name) for name in ("keep-a", "keep-b")}
    backup = tmp_path / "backup.json"
    c.ctl("admin", "backup", "-o", str(backup))
    assert json.loads(backup.read_text())["format"] == "persys-backup/v1"

    # The database is lost: etcd comes back with an empty data directory.
    etcd.stop()
    shutil.rmtree(etcd.workdir / "data", ignore_errors=True)
    for d in etcd.workdir.iterdir():
        if d.is_dir():
            shutil.rmtree(d)
    etcd.start()
    h, _ = eventually(lambda: (lambda h: h if h["mode"] == "recovery" else None)(c.health()), 15, "recovery")
    assert "marker" in h["detail"] or "backwards" in h["detail"]
    time.sleep(4)  # agents keep receiving desired state (with mode=recovery) and must delete nothing
    assert all(pid_alive(p) for p in pids.values()), "no workload may be stopped in recovery"
    refused = c.ctl("apply", "-f", "-", stdin=process_manifest("other"), check=False)
    assert refused.returncode == 1 and "recovery" in refused.stderr

    # Restoring outside recovery needs --force; in recovery it just works.
    c.ctl("admin", "restore", "-f", str(backup))
    eventually(lambda: c.health()["mode"] == "normal", 10, "normal after restore")
    for name, pid in pids.items():
        assert running_pid(c, name) == pid, "adopted, not restarted"
    assert pid_alive(pids["keep-a"])
    again = c.ctl("admin", "restore", "-f", str(backup), check=False)
    assert again.returncode == 1 and "not in recovery" in again.stderr
