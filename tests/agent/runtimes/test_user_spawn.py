"""Commands started as another user from the spawning thread (user_spawn.py) get exactly that
user's credentials, no capabilities and no groups, and nothing else in the agent changes user:
the caller's thread stays root during and after, and the spawning thread is root again after
each start, also after one that failed. Real processes, their credentials read from /proc."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from persys.agent.runtimes.supervision import spawn_session
from persys.agent.runtimes.user_spawn import UserSpawner, user_spawner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
NOBODY = 65534


def status(pid: int, uid: int | None = None) -> dict[str, str]:
    """The process's status; with `uid`, once its exec has committed the new credentials. A
    vfork parent is woken early in the child's execve (when the child leaves the shared memory),
    before the kernel installs the exec's credentials: for a moment /proc still shows the
    spawning thread's saved uid 0. A child whose saved uid stayed 0 fails after 5 s."""
    deadline = time.monotonic() + 5.0
    while True:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        st = {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}
        if uid is None or st["Uid"].split()[2] == str(uid) or time.monotonic() > deadline:
            return st
        time.sleep(0.001)


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="persys-user-spawn-") as d:
        os.chmod(d, 0o711)  # nobody may enter it, as the process runtime's work dirs
        yield Path(d)


def started(folder: Path, uid: int, gid: int) -> subprocess.Popen[bytes]:
    return spawn_session(["sleep", "30"], cwd=folder, stdout=folder / f"out-{uid}.log", user=uid, group=gid,
                         extra_groups=[])


@pytest.mark.parametrize(("uid", "gid"), [(NOBODY, NOBODY), (1234, 5678)])
def test_the_child_has_the_users_ids_and_nothing_more(folder: Path, uid: int, gid: int) -> None:
    assert user_spawner().usable  # this machine: x86_64, root
    child = started(folder, uid, gid)
    try:
        st = status(child.pid, uid)
        assert st["Uid"].split() == [str(uid)] * 4  # real, effective, saved, filesystem
        assert st["Gid"].split() == [str(gid)] * 4
        assert st["Groups"] == ""
        assert int(st["CapPrm"], 16) == 0 and int(st["CapEff"], 16) == 0 and int(st["CapAmb"], 16) == 0
        assert st["NoNewPrivs"] == "0"  # as with a switch in the child: nothing else changed
    finally:
        child.kill()
        child.wait()
    assert os.getresuid() == (0, 0, 0) and os.getresgid()[0] == 0  # the caller never changed


def test_the_spawning_thread_is_root_again_after_each_start_and_a_failed_one(folder: Path) -> None:
    spawner = UserSpawner()
    try:
        ids = spawner.run_as(NOBODY, NOBODY, lambda: (os.getresuid(), os.getresgid(), os.getgroups()))
        assert ids == ((NOBODY, NOBODY, 0), (NOBODY, NOBODY, ids[1][2]), [])
        with pytest.raises(FileNotFoundError):
            spawner.run_as(NOBODY, NOBODY, lambda: subprocess.Popen(["/nonexistent/cmd"]))
        locked = folder / "locked"  # a folder nobody cannot enter: entered as root, as Popen's child does
        locked.mkdir(mode=0o700)
        child = spawner.run_as(NOBODY, NOBODY, lambda: subprocess.Popen(["sleep", "30"]), cwd=locked)
        try:
            assert os.readlink(f"/proc/{child.pid}/cwd") == str(locked)
            assert status(child.pid, NOBODY)["Uid"].split() == [str(NOBODY)] * 4
        finally:
            child.kill()
            child.wait()
        assert os.getcwd() != str(locked)  # the agent's own directory never moved
        # Each switch starts from root (a thread left as nobody could not take uid 1234, and
        # refuses to start anything when it finds itself not root).
        assert spawner.run_as(NOBODY, NOBODY, os.getuid) == NOBODY
        assert spawner.run_as(1234, 1234, os.getresuid) == (1234, 1234, 0)
        assert spawner.usable
    finally:
        spawner.close()


def test_other_threads_stay_root_while_the_spawning_thread_is_switched(folder: Path) -> None:
    spawner = UserSpawner()
    inside, release = threading.Event(), threading.Event()

    def hold() -> int:
        inside.set()
        release.wait(10)
        return os.geteuid()

    try:
        seen: list[int] = []
        fut = threading.Thread(target=lambda: seen.append(spawner.run_as(NOBODY, NOBODY, hold)))
        fut.start()
        assert inside.wait(10)
        assert os.getresuid() == (0, 0, 0)  # this thread, while the other is nobody
        (folder / "root-file").write_text("written as root")
        assert (folder / "root-file").stat().st_uid == 0
        release.set()
        fut.join(10)
        assert seen == [NOBODY]
    finally:
        release.set()
        spawner.close()
