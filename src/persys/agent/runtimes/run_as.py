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
from persys.policy.uids import NameLookup, canonical_root, judge_user

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


def _node_uid(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, ValueError, OverflowError):
        return None


def _lookup(user: str, names: NameLookup = _node_uid) -> RunAs:
    """`user` as this node means it. Numbers are numbers ("00" is uid 0, never a name), names
    resolve through the node's user table; the spec's own word for root (`root`, any spelling
    of 0) is what the scheduler's policy judged, so a name that is uid 0 only here is refused."""
    verdict = judge_user(user, names)
    if verdict.rule:
        raise RuntimeFailure(f"spec.process.user: {verdict.problem}", code="InvalidSpec", terminal=True)
    if verdict.uid is None:
        raise RuntimeFailure(f"spec.process.user: user {user!r} does not exist on this node", code="InvalidSpec",
                             terminal=True)
    if verdict.is_root and not canonical_root(user):
        raise RuntimeFailure(f"spec.process.user: {user!r} is uid 0 (root) on this node; a spec runs as root "
                             "only by saying root, where the workload policy allows it", code="PolicyViolation",
                             terminal=True)
    try:
        pw = pwd.getpwuid(verdict.uid)
    except KeyError:  # a uid without a passwd entry: its own group id, as Docker does
        return RunAs(verdict.uid, verdict.uid, str(verdict.uid))
    return RunAs(pw.pw_uid, pw.pw_gid, pw.pw_name)


def resolve_user(requested: str | None, default: str = DEFAULT_WORKLOAD_USER,
                 names: NameLookup = _node_uid) -> RunAs:
    """The user to run as; raises a terminal RuntimeFailure for one that cannot be used here.
    `names`: the node's user table (a seam for tests: a name that is uid 0 is not made lightly)."""
    if os.geteuid() != 0:
        me = _lookup(str(os.geteuid()))
        if requested is not None and _lookup(requested, names).uid != me.uid:
            raise RuntimeFailure(f"user {requested!r}: this agent runs as {me.name} and cannot switch users",
                                 code="InvalidSpec", terminal=True)
        return me
    return _lookup(requested if requested is not None else default, names)
