"""Starting a command as another user without copying the agent.

`subprocess.Popen(user=..., group=...)` changes user in the child, so CPython cannot use vfork
there and forks: it copies the agent's page tables, 7-10 ms for an agent of ~130 MB (most of a
process workload's start; without a user change Popen takes ~0.1 ms).

Linux keeps credentials per thread, and the raw setgroups/setresgid/setresuid system calls change
only the calling thread's (glibc's wrappers change every thread of the process). One dedicated
thread takes the workload user's ids, with the saved uid left 0, vforks and execs the command,
then takes root's ids back. The child starts with that thread's credentials; execve sets its
saved ids to the user's, and an exec with no root uid grants no capabilities: the command runs
with exactly the credentials `setreuid` in the child would give it. The working directory is
entered as root, as Popen's child does before its switch: the thread has its own (unshared)
current directory, changes into it before taking the user's ids, and the child inherits it.

A side effect: once a thread changed its effective uid the kernel marks the agent's process not
dumpable (no core dumps, /proc and ptrace for root only), which changes nothing for a root daemon.

The thread checks its ids (getresuid/getresgid/getgroups are per thread) before every spawn:
a switch that did not happen never starts anything as root. A thread that could not take root's
ids back is never used again, and unknown architectures or an agent that is not root use
Popen's own switch.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# (setgroups, setresuid, setresgid) system call numbers per architecture.
_SYSCALLS = {"x86_64": (116, 117, 119), "aarch64": (159, 147, 149)}
CLONE_FS = 0x200  # unshare(): this thread's own current directory, umask and root


class _Creds:
    """The calling thread's credentials through the raw system calls."""

    def __init__(self, numbers: tuple[int, int, int]) -> None:
        self._setgroups, self._setresuid, self._setresgid = numbers
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long

    @staticmethod
    def _checked(rc: int) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def _call(self, nr: int, *args: int | ctypes.Array[ctypes.c_uint] | None) -> None:
        c_args = [a if isinstance(a, ctypes.Array) or a is None else ctypes.c_long(a) for a in args]
        self._checked(self._libc.syscall(ctypes.c_long(nr), *c_args))

    def set_groups(self, groups: list[int]) -> None:
        arr = (ctypes.c_uint * max(len(groups), 1))(*groups)
        self._call(self._setgroups, len(groups), arr)

    def set_resgid(self, r: int, e: int, s: int) -> None:
        self._call(self._setresgid, r, e, s)

    def set_resuid(self, r: int, e: int, s: int) -> None:
        self._call(self._setresuid, r, e, s)

    def own_directory(self) -> None:
        self._checked(self._libc.unshare(ctypes.c_int(CLONE_FS)))


class UserSpawner:
    """Runs callables (a Popen) in one thread that holds a user's ids while they run."""

    def __init__(self) -> None:
        numbers = _SYSCALLS.get(platform.machine())
        self._creds = _Creds(numbers) if numbers is not None and os.geteuid() == 0 else None
        self._pool: ThreadPoolExecutor | None = None
        self._broken = False
        self._lock = threading.Lock()

    @property
    def usable(self) -> bool:
        return self._creds is not None and not self._broken

    def run_as(self, uid: int, gid: int, fn: Callable[[], T], cwd: str | os.PathLike[str] | None = None) -> T:
        """`fn()` in the spawning thread while it has uid/gid and no supplementary groups, its
        current directory `cwd` (entered as root) when given."""
        if not self.usable:
            raise RuntimeError("no per-thread user switch here")
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="persys-user-spawn")
                self._pool.submit(self._own_directory).result()
            pool = self._pool
        if not self.usable:
            raise RuntimeError("no per-thread user switch here")
        return pool.submit(self._in_thread, uid, gid, fn, cwd).result()

    def _own_directory(self) -> None:
        assert self._creds is not None
        try:
            self._creds.own_directory()
        except OSError:
            self._broken = True  # a chdir there would move the whole agent
            log.exception("the spawning thread cannot have its own directory; switching in the child")

    def _in_thread(self, uid: int, gid: int, fn: Callable[[], T], cwd: str | os.PathLike[str] | None) -> T:
        creds = self._creds
        assert creds is not None
        root = (os.getresuid(), os.getresgid(), os.getgroups())
        if root[0] != (0, 0, 0):
            self._broken = True
            raise RuntimeError(f"the spawning thread is not root ({root[0]})")
        os.chdir(cwd or "/")  # as root; this thread's directory only (own_directory)
        try:
            creds.set_groups([])
            creds.set_resgid(gid, gid, root[1][2])
            creds.set_resuid(uid, uid, 0)  # the saved uid 0 is how the thread gets root back
            if os.getresuid() != (uid, uid, 0) or os.getresgid()[:2] != (gid, gid) or os.getgroups():
                raise RuntimeError(f"the spawning thread did not take uid {uid} gid {gid}")
            return fn()
        finally:
            try:
                creds.set_resuid(*root[0])
                creds.set_resgid(*root[1])
                creds.set_groups(root[2])
            except OSError:
                self._broken = True
                log.exception("the spawning thread could not take root's ids back; not used again")
            if (os.getresuid(), os.getresgid(), os.getgroups()) != root:
                self._broken = True

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


_spawner: UserSpawner | None = None
_spawner_lock = threading.Lock()


def user_spawner() -> UserSpawner:
    """The process's one spawning thread (made on first use)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = UserSpawner()
        return _spawner


def popen_as(uid: int | None, gid: int | None, groups: list[int] | None, cwd: str | os.PathLike[str],
             popen: Callable[..., subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """`popen(cwd=..., user kwargs)` in `cwd` as uid/gid with no supplementary groups: from
    the spawning thread (vfork) where it can be, else with Popen's own switch in the child (fork)."""
    if uid is None and gid is None:
        return popen(cwd=cwd)
    spawner = user_spawner()
    if uid is not None and gid is not None and not groups and spawner.usable:
        return spawner.run_as(uid, gid, popen, cwd=cwd)
    return popen(cwd=cwd, user=uid, group=gid, extra_groups=groups)
