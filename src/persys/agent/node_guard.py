"""The node guard: at most one live copy of an `onDisconnect: Stop` instance, without the agent.

The agent stops its Stop instances itself when it loses every scheduler replica
(persys.agent.decide.disconnect). A killed (kill -9) or frozen (SIGSTOP, a hung host process) agent
cannot: its instances ran on while the scheduler relocated them, two live copies (issue #31).
So a separate process on the node, the guard (`python -m persys.agent.node_guard DIR`, started
by the agent in its own session, so it outlives it), watches a lease the agent renews every
`RENEW_EVERY` seconds from its event loop. When the lease has not been renewed for `bound`
seconds (the scheduler's node grace, written into the lease by the agent), the guard kills every
instance the agent listed as guarded (`fence.json`: the Stop instances it runs, with how to
kill each one) and records them in `fired.json`; a restarted agent fences those (they are not
started again on its own until the scheduler's full desired set says where they belong).

Bounds (docs/architecture.md, "Liveness"): the guard acts at most `bound + POLL_EVERY +
KILL_WITHIN` after the agent's last renewal; the scheduler relocates Stop instances of a lost
node only `bound + heartbeat interval + GUARD_SLACK` after the node's last heartbeat, which is
later. An agent that restarts, or whose event loop lags, for less than `bound` keeps its
instances: the new agent renews the same lease.

This module holds the file formats and the pure decision (`due`); `node_guard_proc` runs it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RENEW_EVERY = 1.0  # seconds between the agent's lease renewals
POLL_EVERY = 0.5  # seconds between the guard's looks at the lease
KILL_WITHIN = 3.0  # seconds a guard's kill takes at most (SIGKILL, docker stop --time 1, virsh destroy)
GUARD_SLACK = POLL_EVERY + KILL_WITHIN + 1.5  # what the scheduler adds to the bound (and a margin)
DEFAULT_BOUND = 10.0  # the default node grace, until the agent has learned the scheduler's

LEASE = "lease.json"
FENCE = "fence.json"
FIRED = "fired.json"
LOCK = "guard.lock"
PID = "guard.pid"


@dataclass(frozen=True)
class Lease:
    renewed: float  # wall-clock time of the agent's last renewal
    bound: float  # seconds without a renewal after which the guard kills the guarded instances
    agent_pid: int = 0


def relocation_delay(grace: float, heartbeat_interval: float) -> float:
    """Seconds after a node's last heartbeat before the scheduler relocates its Stop instances:
    by then the guard has killed them (the agent renewed its lease at most a heartbeat interval
    before dying unheard, the guard acts within bound + POLL_EVERY + KILL_WITHIN)."""
    return grace + heartbeat_interval + GUARD_SLACK


def due(lease: Lease | None, now: float) -> bool:
    """Whether the guard must kill the guarded instances now (no lease yet: no agent ever ran)."""
    return lease is not None and now - lease.renewed > lease.bound


def _write(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)  # readers see the old or the new file, never half of one


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_lease(folder: Path, lease: Lease) -> None:
    _write(folder / LEASE, {"renewed": lease.renewed, "bound": lease.bound, "agentPid": lease.agent_pid})


def read_lease(folder: Path) -> Lease | None:
    doc = _read(folder / LEASE)
    if not isinstance(doc, dict):
        return None
    try:
        return Lease(float(doc["renewed"]), float(doc["bound"]), int(doc.get("agentPid", 0)))
    except (KeyError, TypeError, ValueError):
        return None


def write_fence(folder: Path, entries: list[dict[str, Any]]) -> None:
    """The instances to kill when the lease lapses: {"instance", "runtime", ...how to find it}."""
    _write(folder / FENCE, entries)


def read_fence(folder: Path) -> list[dict[str, Any]]:
    doc = _read(folder / FENCE)
    return [e for e in doc if isinstance(e, dict) and "instance" in e] if isinstance(doc, list) else []


def record_fired(folder: Path, instances: list[str], at: float) -> None:
    fired = read_fired(folder)
    fired.update(dict.fromkeys(instances, at))
    _write(folder / FIRED, fired)


def read_fired(folder: Path) -> dict[str, float]:
    doc = _read(folder / FIRED)
    return {str(k): float(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def take_fired(folder: Path) -> dict[str, float]:
    """What the guard killed while no agent ran (the agent fences those); the record is consumed."""
    fired = read_fired(folder)
    if fired:
        (folder / FIRED).unlink(missing_ok=True)
    return fired


def guard_running(folder: Path) -> bool:
    """Whether a guard holds this folder's lock (one guard per node and state directory)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock we took
    return False


def now() -> float:
    return time.time()
