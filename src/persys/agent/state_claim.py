"""An agent's state folder names the cluster it belongs to (`<state>/cluster-id`, the cluster's
id from security.cluster_id): two clusters on one host given the same --state-dir would adopt,
stop and remove each other's process instances, secret files and volumes, so the second one is
refused at start with what to do. A folder from before cluster ids is claimed by the first agent
that starts on it (its instances are that node's: it adopted them before)."""

from __future__ import annotations

import os
from pathlib import Path

MARKER = "cluster-id"


class StateDirTaken(Exception):
    """The state folder belongs to another cluster."""


def claim_state_dir(state_dir: Path, cluster_id: str) -> None:
    """Record `cluster_id` in `state_dir` if it names none; StateDirTaken if it names another."""
    if not cluster_id:
        return
    marker = state_dir / MARKER
    try:
        found = marker.read_text().strip()
    except FileNotFoundError:
        found = ""
    if found and found != cluster_id:
        raise StateDirTaken(f"state dir {state_dir} belongs to cluster {found}, not this agent's cluster {cluster_id}: "
                            "give each cluster's agent its own --state-dir")
    if found:
        return
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_name(f".{MARKER}.{os.getpid()}")
    tmp.write_text(cluster_id + "\n")
    tmp.chmod(0o644)  # not secret: who the folder belongs to
    os.replace(tmp, marker)
