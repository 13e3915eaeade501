"""The agent's own check of node paths a workload names (defence in depth behind the scheduler's
workload policy: a scheduler of an older version, or a restored backup, must not make an agent
read `/etc/shadow` as a compose file, a VM disk or a microVM root filesystem).

A path is resolved on this node (symbolic links and `..` followed) and must lie inside one of the
agent's node paths: its state directory (the image store is `<state_dir>/runtimes/images`),
Persys' default `/var/lib/persys`, and whatever `persys agent --allow-node-path` adds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from persys.agent.runtimes.base import RuntimeFailure
from persys.policy.model import DEFAULT_NODE_PATHS
from persys.policy.paths import within


class NodePaths:
    def __init__(self, roots: Iterable[str | Path]) -> None:
        self.roots = sorted({os.path.realpath(r) for r in roots})

    @classmethod
    def for_agent(cls, state_dir: Path, extra: Iterable[str | Path] = ()) -> NodePaths:
        return cls([*DEFAULT_NODE_PATHS, state_dir, *extra])

    def check(self, value: str, what: str) -> Path:
        """The resolved path, or a terminal failure naming `what` (never the file's content)."""
        real = os.path.realpath(value)
        if not within(real, self.roots):
            raise RuntimeFailure(
                f"{what} {value!r} is outside the node paths this agent serves ({', '.join(self.roots)}; "
                f"`persys agent --allow-node-path` adds one)", code="PolicyViolation", terminal=True)
        return Path(real)
