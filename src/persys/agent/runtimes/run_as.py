"""Which user a host process runs as: the agent's unprivileged workload user unless the spec
names one (the scheduler's workload policy admits `root` only where an admin allows it).

An agent running as root starts the command with the user's ids and no supplementary groups
(user_spawn.py: from a thread holding them, or Popen's own switch in the child); an agent that is
not root cannot switch, so its processes run as the agent's own user and naming another is refused.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any

from persys.agent.runtimes.base import RuntimeFailure

DEFAULT_WORKLOAD_USER = "nobody"


@dataclass(frozen=True, slots=True)
class RunAs:
    uid: int
    gid: int
    name: str

    @property
    def switches(self) -> bool:
        """Whether the child changes user (the agent is root and the target is someone else)."""
        return os.geteuid() == 0 and self.uid != 0

    def popen_kwargs(self) -> dict[str, Any]:
        if self.switches:
            return {"user": self.uid, "group": self.gid, "extra_groups": []}
        return {}


def _lookup(user: str) -> RunAs:
    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, ValueError):
        if user.isdigit():  # a uid without a passwd entry: its own group id, as Docker does
            return RunAs(int(user), int(user), user)
        raise RuntimeFailure(f"user {user!r} does not exist on this node", code="InvalidSpec",
                             terminal=True) from None
    return RunAs(pw.pw_uid, pw.pw_gid, pw.pw_name)


def resolve_user(requested: str | None, default: str = DEFAULT_WORKLOAD_USER) -> RunAs:
    """The user to run as; raises a terminal RuntimeFailure for one that cannot be used here."""
    if os.geteuid() != 0:
        me = _lookup(str(os.geteuid()))
        if requested is not None and _lookup(requested).uid != me.uid:
            raise RuntimeFailure(f"user {requested!r}: this agent runs as {me.name} and cannot switch users",
                                 code="InvalidSpec", terminal=True)
        return me
    return _lookup(requested if requested is not None else default)
