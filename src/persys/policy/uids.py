"""Which user id a process workload's `spec.process.user` means (pure: the lookup is passed in).

Judged as numbers, never as strings: `"00"`, `"0000000000"` and `"root"` are all uid 0. A name
means the id it resolves to where it runs; every name resolving to 0 counts as root, whatever
it is called. Ids past 2^32-2 do not exist: 2^32-1 is `(uid_t)-1`, "no change" to setresuid,
and anything larger does not fit a uid_t.

The scheduler judges a spec with its own host's user table (a best effort: the nodes' may
differ); the agent judges it again with the node's before it starts anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

UID_MAX = 2**32 - 2
ROOT_NAME = "root"

NameLookup = Callable[[str], "int | None"]  # a user name's id on some host; None: no such user


@dataclass(frozen=True, slots=True)
class UserVerdict:
    uid: int | None  # None: a name the lookup does not know (judged on the node, where it runs)
    problem: str = ""  # non-empty: the id is not a user id at all
    rule: str = ""  # "userId" (not an id) or "" (fine, or root: see is_root)

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def judge_user(user: str, lookup: NameLookup) -> UserVerdict:
    """What `user` (a name or a decimal id) means under `lookup`."""
    if user.isdigit():
        uid = int(user)
        if uid > UID_MAX:
            return UserVerdict(None, f"uid {user} is outside 0..{UID_MAX} (a user id is a 32-bit number; "
                                     f"{UID_MAX + 1} means 'no user')", "userId")
        return UserVerdict(uid)
    if user == ROOT_NAME:
        return UserVerdict(0)
    return UserVerdict(lookup(user))


def canonical_root(user: str | None) -> bool:
    """Whether the spec itself says root, as the scheduler's policy saw it (a name that only
    resolves to 0 somewhere is not that: the policy judged it as someone else)."""
    return user is not None and (user == ROOT_NAME or (user.isdigit() and int(user) == 0))


def no_users(_name: str) -> int | None:
    return None
