"""Intents and guards as store operations: the only place the step's writes meet the key layout
(pure)."""

from __future__ import annotations

from persys.model import Node
from persys.scheduler.decide.effects import Guard, Intent, Write
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import put_doc
from persys.store.base import Compare, Delete, Put


def key_of(kind: str, ident: str) -> str:
    if kind == "assignment":
        node_id, _, inst = ident.partition("/")
        return keys.assignment(node_id, inst)
    if kind == "revision":
        wid, _, generation = ident.rpartition("/")
        return keys.revision(wid, int(generation))
    return {"workload": keys.workload, "status": keys.status, "node": keys.node, "volume": keys.volume}[kind](ident)


def compare(g: Guard) -> Compare:
    return Compare(key_of(g.kind, g.ident), g.rev)


def operation(i: Intent) -> Put | Delete:
    key = key_of(i.kind, i.ident)
    if i.doc is None:
        return Delete(key)
    if isinstance(i.doc, Node):
        return Put(key, i.doc.to_json())
    return put_doc(key, i.doc)  # the mirror folds the document in as is, without parsing it back


def store_write(w: Write) -> tuple[list[Compare], list[Put | Delete]]:
    return [compare(g) for g in w.guards], [operation(i) for i in w.intents]


def fenced(w: Write) -> bool | str:
    """`ClusterState.commit`'s fence argument for a write's authority."""
    return True if w.fence == "leader" else (w.fence or False)
