"""Secret files of one instance: written just before it starts into a directory of its own
(mode 0500, files 0400, owned by the user the workload runs as), removed when it stops or is
removed. The only place the agent writes secret values, and only where the workload reads them.

An agent running as root keeps them under /run/persys/secrets/<cluster>-<agent>/ (a tmpfs on most
systems: never on disk; every directory above root-owned and 0711, so the workload's user
reaches its own directory whatever the modes of the agent's state directory); otherwise
beside the runtime's state.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from pathlib import Path

from persys.agent.runtimes.base import RuntimeFailure

RUN_ROOT = Path("/run/persys/secrets")


def secrets_root(fallback: Path, agent_state: Path, cluster_id: str = "") -> Path:
    """Where this agent's instances get their secret directories (see the module's text);
    created by the first write, not here. `cluster_id` (security.cluster_id) leads the folder's
    name, so whose a folder is reads off the host; without it, the name agents before cluster ids
    used (where their instances' files stay until they stop)."""
    if os.geteuid() == 0 and RUN_ROOT.parent.parent.is_dir():
        # One folder per agent state dir: agents sharing a host never touch each other's.
        name = hashlib.sha256(str(agent_state.resolve()).encode()).hexdigest()[:16]
        return RUN_ROOT / (f"{cluster_id}-{name}" if cluster_id else name)
    return fallback


def _ensure_parent(root: Path) -> None:
    if root.parent.is_relative_to(RUN_ROOT.parent):
        for d in (RUN_ROOT.parent, RUN_ROOT, root.parent):
            d.mkdir(mode=0o711, exist_ok=True)
            st = d.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
                raise RuntimeFailure(f"{d} is not a root-owned directory: secret files are not written there")
            d.chmod(0o711)
    else:
        root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)


def write_secret_files(root: Path, files: dict[str, bytes], uid: int | None = None, gid: int | None = None) -> Path:
    """Replace `root` with exactly `files` (relative paths, validated by the model; checked again
    here against escaping). `uid`/`gid`: hand them to the workload's user."""
    remove_secret_files(root)
    _ensure_parent(root)
    root.mkdir(mode=0o700, parents=False)
    base = root.resolve()
    dirs = [root]
    for rel, data in sorted(files.items()):
        path = root / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute() or not path.resolve().is_relative_to(base):
            raise RuntimeFailure(f"secret file path {rel!r} leaves the secrets directory", code="InvalidSpec",
                                 terminal=True)
        for parent in reversed(path.relative_to(root).parents[:-1]):
            d = root / parent
            if not d.exists():
                d.mkdir(mode=0o700)
                dirs.append(d)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if uid is not None and gid is not None:
            os.chown(path, uid, gid)
    for d in dirs:
        if uid is not None and gid is not None:
            os.chown(d, uid, gid)
        d.chmod(0o500)
    return root


def remove_secret_files(root: Path) -> None:
    if not root.exists():
        return
    for d, subdirs, _files in os.walk(root):  # 0500 directories: make them writable to delete
        with contextlib.suppress(OSError):
            os.chmod(d, 0o700)
        for s in subdirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(d, s), 0o700)
    shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(OSError):
        root.parent.rmdir()  # the agent's folder, once its last instance's secrets are gone
