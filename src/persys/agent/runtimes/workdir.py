"""Per-workload directories under `<state_dir>/<runtime>/<id>/`: the base the process, VM and
microVM runtimes keep their files in (a `meta.json` record, logs, disks).

The record is what lets a restarted agent adopt what is still running instead of starting a
duplicate, so it is written atomically; an unreadable one counts as absent.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from persys.agent.files import write_json_atomic
from persys.agent.runtimes.base import RuntimeFailure
from persys.security.private_files import private_file

META_FILE = "meta.json"
_TAIL_BYTES = 1 << 20  # the last 1 MiB is plenty for a tail and bounds memory on huge logs


class _Record(Protocol):
    workload_id: str


M = TypeVar("M", bound=_Record)


class WorkDirs(Generic[M]):
    """The directories of one runtime's workloads and their `meta.json` records of type `M`
    (a dataclass with a `workload_id`)."""

    def __init__(self, root: Path, record: type[M], *, lenient: bool = False) -> None:
        self.root = root
        self._record = record
        # lenient: fields a newer agent wrote and this one does not know are dropped, not fatal.
        self._known = {f.name for f in fields(record)} if lenient else None  # type: ignore[arg-type]

    def path(self, workload_id: str) -> Path:
        return workload_dir(self.root, workload_id)

    def load(self, workload_id: str) -> M | None:
        try:
            doc: dict[str, Any] = json.loads((self.path(workload_id) / META_FILE).read_text())
            if self._known is not None:
                doc = {k: v for k, v in doc.items() if k in self._known}
            return self._record(**doc)
        except (OSError, ValueError, TypeError):
            return None

    def save(self, meta: M) -> None:
        write_json_atomic(self.path(meta.workload_id) / META_FILE, asdict(meta))  # type: ignore[call-overload]

    def ids(self) -> list[str]:
        """Every workload with a directory, sorted (records may still be unreadable)."""
        if not self.root.is_dir():
            return []
        return sorted(d.name for d in self.root.iterdir())

    def remove(self, workload_id: str) -> None:
        shutil.rmtree(self.path(workload_id), ignore_errors=True)


def workload_dir(root: Path, workload_id: str) -> Path:
    """`root/<id>`; refuses ids that would leave the root (a terminal InvalidSpec)."""
    if not workload_id or "/" in workload_id or workload_id in (".", ".."):
        raise RuntimeFailure(f"invalid workload id {workload_id!r}", code="InvalidSpec", terminal=True)
    return root / workload_id


def mark_start(log: Path, what: str) -> None:
    """Appends `--- persys: <what> at <time> ---` to a log, so each start is visible in it. The
    log is the agent's alone (0600): a workload writes its output through the descriptor it is
    given, a VMM as root; no other workload on the node may read it (issue #30)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "ab") as f:
        f.write(f"--- persys: {what} at {time.ctime()} ---\n".encode())
    private_file(log)  # one an earlier version created 0644


def tail_text(path: Path, lines: int, max_bytes: int = _TAIL_BYTES) -> str:
    """The last `lines` lines of a log file ("" if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return ""
    kept = data.decode(errors="replace").splitlines(keepends=True)[-lines:] if lines > 0 else []
    return "".join(kept)
