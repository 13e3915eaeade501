"""Verdicts about the host that every agent on it shares (does KVM really run guests at hardware
speed?), worked out once per boot. A probe takes seconds on a nested host; kept in a folder under
/run (a tmpfs, emptied at boot), a restarted agent, or each of the agents `persys dev` starts,
reads the first one's answer instead of probing again. One prober at a time (a file lock):
agents started together wait for it rather than all booting probe guests at once.

Each verdict is stored with the key it holds for (the QEMU version, the kernel release, ...):
a different key is probed again. Blocks (the lock, the probe): call it from a worker thread."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

HOST_DIR = Path("/run/persys/host-verdicts")
_MAX_BYTES = 64 * 1024  # a verdict is a few fields; anything bigger is not ours


def _file(folder: Path, name: str, key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"{name}-{digest}.json"


def _read(path: Path, key: Mapping[str, Any]) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        with open(path, "rb") as f:
            doc = json.loads(f.read(_MAX_BYTES))
        if doc["key"] == json.loads(json.dumps(key)) and isinstance(doc["verdict"], dict):
            return doc["verdict"]
    return None


def shared_verdict(name: str, key: Mapping[str, Any], probe: Callable[[], dict[str, Any]],
                   folder: Path | None = None) -> dict[str, Any]:
    """The verdict `probe()` gives on this host for `key`: read when an agent already worked it
    out since boot, else probed (by one agent at a time) and kept. `key` and the verdict must be
    JSON. A folder this process cannot write (an unprivileged agent) only costs the sharing."""
    folder = HOST_DIR if folder is None else folder
    path = _file(folder, name, key)
    found = _read(path, key)
    if found is not None:
        return found
    try:
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        lock = open(folder / f"{name}.lock", "a")  # held across the probe below
    except OSError:
        return probe()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released with the file
        found = _read(path, key)  # worked out while this agent waited
        if found is not None:
            return found
        verdict = probe()
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps({"key": key, "verdict": verdict}))
            os.replace(tmp, path)
        except OSError:  # not kept: the next agent probes again, nothing worse
            tmp.unlink(missing_ok=True)
        return verdict
