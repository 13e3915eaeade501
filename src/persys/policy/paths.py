"""Path and git-source rules shared by the scheduler's admission check and the agent's re-check."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

# scp-like ssh: `user@host:path` (git's own rule: a colon before any slash).
_SCP_RE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^/]?.*$")


def within(path: str, roots: Iterable[str]) -> bool:
    """Whether absolute `path`, with `.` and `..` resolved lexically, lies inside one of `roots`.

    Lexical only: symbolic links are for the node to resolve (the agent re-checks the real path)."""
    if not path.startswith("/"):
        return False
    p = posixpath.normpath(path)
    for root in roots:
        r = posixpath.normpath(root)
        if r == "/" or p == r or p.startswith(r + "/"):
            return True
    return False


def url_within(url: str, prefixes: Iterable[str]) -> bool:
    """Whether http(s) `url` is under one of `prefixes`: the same scheme, host and port, and a
    path inside the prefix's (`https://img.example/vm` admits `.../vm/a.qcow2`, not `.../vm2/`
    nor `https://img.example.evil/`). Pure; `..` in the path is resolved lexically first."""
    u = urlsplit(url)
    try:
        u_port = u.port
    except ValueError:
        return False
    path = posixpath.normpath(u.path or "/")
    for prefix in prefixes:
        p = urlsplit(prefix)
        try:
            p_port = p.port
        except ValueError:
            continue
        if (u.scheme.lower(), (u.hostname or "").lower(), u_port) != \
                (p.scheme.lower(), (p.hostname or "").lower(), p_port):
            continue
        root = posixpath.normpath(p.path or "/")
        if root == "/" or path == root or path.startswith(root.rstrip("/") + "/"):
            return True
    return False


def git_source_problem(url: str) -> str | None:
    """Why a compose gitRepo is not a remote https or ssh source, or None if it is.

    `file://`, local paths and git's transports that run commands or read the node (`ext::`,
    `fd::`, `file::`) would let a workload clone what is on the node itself."""
    u = url.strip()
    if u.startswith("-"):
        return "must not start with '-'"
    if "::" in u.split("/", 1)[0]:
        return "git remote helpers (`<transport>::`) are not allowed; use https:// or ssh"
    lower = u.lower()
    if lower.startswith(("https://", "ssh://", "git+ssh://", "ssh+git://")):
        return None
    if "://" not in u and _SCP_RE.match(u) and not u.startswith(("/", ".", "~")):
        return None
    return "only https:// and ssh sources are allowed (file:// and local paths read the node itself)"
