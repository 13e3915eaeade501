"""Which node ids are acceptable: they become etcd keys, file names, certificate names and DNS
labels (`<id>.node.persys.internal`), so only a DNS-name-like charset and length pass."""

from __future__ import annotations

import re

NODE_ID_MAX = 63
# Lower-case letters, digits, '-' and '.', starting and ending with a letter or digit; no '..'
# (a path step) and no empty DNS label.
_NODE_ID = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")


def node_id_problem(node_id: str) -> str | None:
    """Why `node_id` is not acceptable (None: it is)."""
    if not node_id:
        return "node_id is required"
    if len(node_id) > NODE_ID_MAX:
        return f"node_id is {len(node_id)} characters long (at most {NODE_ID_MAX})"
    if not _NODE_ID.fullmatch(node_id) or ".." in node_id or ".-" in node_id or "-." in node_id:
        return (f"node_id {node_id[:NODE_ID_MAX]!r} must be lower-case letters, digits, '-' and '.', "
                "starting and ending with a letter or digit")
    return None
