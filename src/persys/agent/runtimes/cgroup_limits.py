"""cgroup v1 naming and memory-limit ordering for host processes (pure: no file access).

Names: `<parent>/<cluster>-<agent>/<instance>`, so two agents on one host, even of two clusters
with a node named alike, never share a cgroup and an agent finds its own leftovers (the cluster's
id: security.cluster_id; instances started before it live on under the names they recorded).
Limits: cgroup v1 refuses (EINVAL) any write that would leave
memory.limit_in_bytes above memory.memsw.limit_in_bytes, so the order of the two writes depends
on the limits already there; a leftover cgroup may hold anything.
"""

from __future__ import annotations

import hashlib
import re

MEMORY = "memory.limit_in_bytes"
MEMSW = "memory.memsw.limit_in_bytes"
UNLIMITED = -1

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def agent_cgroup_name(agent_id: str, state_dir: str, cluster_id: str = "") -> str:
    """This agent's directory under the persys parent: its node id, or (no id given) a name
    derived from its state directory, which is just as much its own; after its cluster's id."""
    if agent_id:
        name = _SAFE.sub("_", agent_id)
        name = name if name not in (".", "..") else f"_{name}"
    else:
        name = "state-" + hashlib.sha256(state_dir.encode()).hexdigest()[:12]
    return f"{_SAFE.sub('_', cluster_id)}-{name}" if cluster_id else name


def _bytes(limit: int) -> float:
    return float("inf") if limit < 0 else float(limit)


def memory_limit_writes(target: int, current_memory: int | None, has_memsw: bool) -> list[tuple[str, int]]:
    """The writes that set both limits to `target` (-1: unlimited), in an order the kernel
    accepts from the current state. Raising: the swap limit first; lowering: memory first.
    Unknown current limits: lift the swap limit, then set memory, then the swap limit."""
    if not has_memsw:
        return [(MEMORY, target)]
    if current_memory is None:
        return [(MEMSW, UNLIMITED), (MEMORY, target), (MEMSW, target)]
    # memsw >= memory holds before; each order below keeps it after every single write.
    if _bytes(target) >= _bytes(current_memory):
        return [(MEMSW, target), (MEMORY, target)]
    return [(MEMORY, target), (MEMSW, target)]
