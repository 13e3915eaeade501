"""The node guard's process (`python -m persys.agent.node_guard_proc DIR`): see node_guard.py.

It holds DIR/guard.lock for its whole life (one guard per agent state directory), polls the
agent's lease every POLL_EVERY seconds and, once it lapsed past its bound, kills every guarded
instance and exits: a new agent starts a new guard. It imports nothing of the agent's runtimes
(it must work while they, or the agent, are broken): kills are by pid (checked against the
kernel's start time, so a recycled pid is never hit), `docker kill` and `virsh destroy`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from persys.agent import node_guard as ng

log = logging.getLogger("persys.node_guard")
MAX_ATTEMPTS = 20  # kills tried per lapse before the guard gives up on what it cannot stop


def _start_ticks(pid: int) -> tuple[int, int, str] | None:
    """(start ticks, pgid, state) of a pid, None when it does not exist."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[19]), int(rest[2]), rest[0]


def _kill_pid(entry: dict[str, Any]) -> bool:
    pid, ticks = int(entry.get("pid", 0)), int(entry.get("startTicks", -1))
    info = _start_ticks(pid) if pid > 0 else None
    if info is None or info[0] != ticks or info[2] in ("Z", "X"):
        return True  # gone already (or the pid now belongs to another process: not ours to kill)
    target_group = entry.get("group", False) and info[1] == pid  # the leader of its own group
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if target_group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    return True


def _run(argv: list[str]) -> bool:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=ng.KILL_WITHIN)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.error("%s: %s", " ".join(argv), err)
        return False
    if r.returncode != 0 and "is not running" not in r.stderr and "No such container" not in r.stderr:
        log.error("%s: %s", " ".join(argv), r.stderr.strip()[:300])
        return False
    return True


def _kill(entry: dict[str, Any]) -> bool:
    kind = entry.get("kind")
    if kind == "pid":
        return _kill_pid(entry)
    # `docker stop` (1 s, then SIGKILL), not `docker kill`: a stop counts as manual, so a restart
    # policy a Compose file may set does not bring the container back.
    if kind == "docker":
        return _run(["docker", "stop", "--time", "1", str(entry["id"])])
    if kind == "compose":
        try:
            ids = subprocess.run(["docker", "ps", "-q", "--filter",
                                  f"label=com.docker.compose.project={entry['project']}"],
                                 capture_output=True, text=True, timeout=ng.KILL_WITHIN).stdout.split()
        except (OSError, subprocess.TimeoutExpired) as err:
            log.error("listing compose project %s: %s", entry["project"], err)
            return False
        return _run(["docker", "stop", "--time", "1", *ids]) if ids else True
    if kind == "libvirt":
        return _run(["virsh", "-c", str(entry.get("uri", "qemu:///system")), "destroy", str(entry["uuid"])])
    log.error("do not know how to kill %s (%s)", entry.get("instance"), kind)
    return False


def fire(folder: Path) -> list[str]:
    """Kill every guarded instance; returns those killed (recorded for the next agent)."""
    entries = ng.read_fence(folder)
    killed = [str(e["instance"]) for e in entries if _kill(e)]
    if killed:
        ng.record_fired(folder, killed, ng.now())
    ng.write_fence(folder, [e for e in entries if str(e["instance"]) not in killed])
    return killed


def run(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ng.LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another guard watches this folder
    (folder / ng.PID).write_text(str(os.getpid()))
    log.info("guarding %s", folder)
    attempts = 0
    while folder.is_dir():
        lease = ng.read_lease(folder)
        if ng.due(lease, ng.now()):
            assert lease is not None
            killed = fire(folder)
            log.warning("agent lease lapsed (%.1fs > %.1fs): killed %s", ng.now() - lease.renewed, lease.bound,
                        ", ".join(killed) or "nothing (none guarded)")
            left = ng.read_fence(folder)
            if not left:
                break  # done; the next agent starts a new guard
            attempts += 1
            if attempts >= MAX_ATTEMPTS:
                log.error("could not stop %s after %d attempts; giving up (the next agent takes over)",
                          ", ".join(str(e["instance"]) for e in left), attempts)
                break
            time.sleep(min(attempts, 5) * ng.POLL_EVERY)  # a failing engine is not hammered
        else:
            attempts = 0
        time.sleep(ng.POLL_EVERY)
    (folder / ng.PID).unlink(missing_ok=True)
    return 0


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s node-guard %(levelname)s %(message)s")
    if len(sys.argv) != 2:
        sys.exit("usage: python -m persys.agent.node_guard_proc AGENT_STATE_DIR/guard")
    sys.exit(run(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
