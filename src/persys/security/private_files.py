"""State and log files of the agent and the scheduler are theirs alone (issue #30, 8): files 0600,
folders without read or write for anyone else. Applied at start to what an earlier version left
(0644 files in 0755 folders: agent.db held every spec and plain env of the node, readable by
every workload), and by the code that creates them.

Only what this process's user owns is changed, and a folder owned by someone else (a process
workload's work folder, chowned to its uid) is neither changed nor entered. The agent's folders
keep their search bit for others (`traversable`): a workload reaches its own work and secret
folders, and libvirt's QEMU its disks, below the agent's state folder, by name; no one else may
list a folder or read a file in it. The scheduler's folder has no such guests: 0700.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# The files the agent keeps about itself and its workloads (its database, output and console
# logs, records); other files under its folder are the workloads' own and keep their modes.
AGENT_FILES = (".db", ".db-wal", ".db-shm", ".db-journal", ".log", ".json", ".jsonl")
# <state>/runtimes/<runtime>/<workload>/: deeper lie images and root filesystems, kept as they are.
AGENT_DEPTH = 3


def private_file(path: Path) -> None:
    """`path` (ours, not a link) with no permission for group or others; absent: nothing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)


def private_dir(path: Path, *, traversable: bool = False) -> None:
    """`path` created if missing; ours: no read or write for group and others (their search bit
    kept only when `traversable`)."""
    path.mkdir(parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return
    mode = stat.S_IMODE(st.st_mode)
    want = mode & ~0o066 if traversable else mode & ~0o077
    if want != mode:
        os.chmod(path, want)


def _left_alone(root: Path, marker: str, max_depth: int) -> tuple[set[Path], set[Path]]:
    """Folders below `root` holding a file named `marker` (another component's state: an agent
    folder inside a shared data folder), and the folders on the way to them."""
    left: set[Path] = set()
    for here, dirs, files in os.walk(root, followlinks=False):
        if len(Path(here).relative_to(root).parts) >= max_depth:
            dirs[:] = []
        if marker in files and Path(here) != root:
            left.add(Path(here))
            dirs[:] = []
    on_the_way = {parent for f in left for parent in f.parents if parent == root or root in parent.parents}
    return left, on_the_way


def tighten_tree(root: Path, *, traversable: bool = False, suffixes: tuple[str, ...] | None = None,
                 max_depth: int = 64, leave: str | None = None) -> int:
    """Every folder and file below `root` (root included, down to `max_depth` folders below it)
    made private as above; with `suffixes`, only files whose names end so. Never follows a link,
    never enters a folder owned by another user, nor (with `leave`) one holding a file of that
    name, whose parents then keep their search bit. Returns how many entries changed."""
    left, on_the_way = _left_alone(root, leave, max_depth) if leave else (set(), set())
    changed = 0
    private_dir(root, traversable=traversable or root in on_the_way)
    for here, dirs, files in os.walk(root, followlinks=False):
        depth = len(Path(here).relative_to(root).parts)
        if depth >= max_depth:
            dirs[:] = []
        keep = []
        for d in dirs:
            p = Path(here) / d
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and p not in left:
                before = stat.S_IMODE(st.st_mode)
                private_dir(p, traversable=traversable or p in on_the_way)
                changed += before != stat.S_IMODE(os.lstat(p).st_mode)
                keep.append(d)
        dirs[:] = keep
        for f in files:
            if suffixes is not None and not f.endswith(suffixes):
                continue
            p = Path(here) / f
            before = stat.S_IMODE(os.lstat(p).st_mode)
            private_file(p)
            changed += before != stat.S_IMODE(os.lstat(p).st_mode)
    return changed
