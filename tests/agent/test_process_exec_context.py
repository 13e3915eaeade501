"""An exec into a process never runs without the process's environment: /proc/<pid>/environ reads
empty while the process is inside an exec, so an empty one is waited for, then refused."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from persys.agent.runtimes.base import RuntimeFailure
from persys.agent.runtimes.process_exec import read_context


@pytest.fixture
def empty_env_child() -> Iterator[int]:
    child = subprocess.Popen(["/bin/sleep", "30"], env={})  # Popen returns after the exec
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


def test_an_empty_environment_is_refused_not_used(empty_env_child: int) -> None:
    with pytest.raises(RuntimeFailure) as err:
        read_context(empty_env_child, settle=0.05)
    assert err.value.code == "NotRunning" and "try again" in str(err.value)


def test_a_process_environment_is_read() -> None:
    child = subprocess.Popen(["/bin/sleep", "30"], env={"GREETING": "hi", "PATH": "/bin"}, cwd="/")
    try:
        ctx = read_context(child.pid, settle=0.05)
        assert ctx.env == {"GREETING": "hi", "PATH": "/bin"} and ctx.cwd == "/" and ctx.uid == os.geteuid()
    finally:
        child.kill()
        child.wait()
