"""Store events folded into the mirror (pure): a put or delete of a key becomes a change to the
documents and indexes, or nothing when it is stale (older than what the mirror holds, or than
the key's deletion) or not a document the mirror keeps.

Tombstones stop an older put from resurrecting a key a newer delete removed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from pydantic import BaseModel

from persys.model import Assignment, Node, Workload, WorkloadStatus
from persys.model.volume import Volume, VolumeAttachment
from persys.scheduler.decide.mirror import NO_CHANGE, Change, Mirror
from persys.scheduler.decide.refused import RefusedWorkload
from persys.scheduler.decide.shards import decode_members
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.quarantine import parse_stored
from persys.store.base import KeyValue, WatchEvent

log = logging.getLogger(__name__)
TOMBSTONES_KEPT = 1024  # past this many, tombstones the watch has passed are dropped


def stale(m: Mirror, key: str, rev: int) -> bool:
    return rev <= m.key_revs.get(key, 0) or rev <= m.tombstones.get(key, 0)


def fold_put(m: Mirror, key: str, value: bytes, rev: int, doc: BaseModel | None = None) -> Change:
    """Fold a put in unless it is stale; returns what changed, NO_CHANGE if nothing. `doc`: the
    document the value encodes, when the writer has it (not parsed again)."""
    if stale(m, key, rev):
        return NO_CHANGE
    m.key_revs[key] = rev
    m.tombstones.pop(key, None)
    if key.startswith(keys.REVISIONS):  # indexed by key alone; nothing acts on it: no listener is told
        _index_revision(m, key, True)
        return NO_CHANGE
    try:
        return _put_document(m, key, value, rev, doc)
    except (ValueError, TypeError, AttributeError) as err:
        # Valid JSON of the wrong shape (a list where an object belongs) too: one bad value
        # must not stop the mirror, which would otherwise be handed the same event forever.
        log.error("ignoring undecodable document at %s: %s: %s", key, type(err).__name__, err)
        return NO_CHANGE


def fold_delete(m: Mirror, key: str, rev: int) -> Change:
    if stale(m, key, rev):
        return NO_CHANGE
    m.key_revs.pop(key, None)
    m.tombstones[key] = rev
    if key.startswith(keys.REVISIONS):
        _index_revision(m, key, False)
        return NO_CHANGE
    return _drop_document(m, key)


def fold_event(m: Mirror, ev: WatchEvent) -> Change:
    """One watch event; the mirror's revision moves to the event's."""
    if ev.type == "put":
        change = fold_put(m, ev.kv.key, ev.kv.value, ev.kv.mod_revision)
    else:
        change = fold_delete(m, ev.kv.key, ev.revision)
    m.revision = max(m.revision, ev.revision)
    # Older events can no longer arrive: drop tombstones the watch has passed.
    if len(m.tombstones) > TOMBSTONES_KEPT:
        m.tombstones = {k: r for k, r in m.tombstones.items() if r > m.revision}
    return change


def fold_snapshot(m: Mirror, kvs: Sequence[KeyValue], revision: int) -> list[Change]:
    """Make the mirror what a snapshot read at `revision` holds: keys it lacks are deleted as of
    `revision`, changed keys updated. Writes that landed after the snapshot are newer and stay."""
    changed: list[Change] = []
    present = {kv.key for kv in kvs}
    for key in [k for k in m.key_revs if k not in present]:
        changed.append(fold_delete(m, key, revision))
    for kv in kvs:
        if kv.mod_revision != m.key_revs.get(kv.key):
            changed.append(fold_put(m, kv.key, kv.value, kv.mod_revision))
    m.revision = max(m.revision, revision)
    return [c for c in changed if c[0]]


def _put_document(m: Mirror, key: str, value: bytes, rev: int, doc: BaseModel | None) -> Change:
    if key.startswith(keys.WORKLOADS):
        wid = key.removeprefix(keys.WORKLOADS)
        w = doc if isinstance(doc, Workload) else parse_stored(wid, value)
        if isinstance(w, RefusedWorkload):
            log.error("stored workload %s refused by the model (kept, not placed): %s", wid, "; ".join(w.problems))
        return m.set_workload(wid, w, rev)
    if key.startswith(keys.STATUS):
        st = doc if isinstance(doc, WorkloadStatus) else WorkloadStatus.model_validate_json(value)
        return m.set_status(key.removeprefix(keys.STATUS), st, rev)
    if key.startswith(keys.NODES):
        return m.set_node(Node.model_validate_json(value), rev)
    if key.startswith(keys.VOLUMES):
        return m.set_volume(doc if isinstance(doc, Volume) else Volume.model_validate_json(value), rev)
    if key.startswith(keys.ATTACHMENTS):
        att = doc if isinstance(doc, VolumeAttachment) else VolumeAttachment.model_validate_json(value)
        node_id, vid = keys.parse_attachment(key)
        return m.set_attachment(node_id, vid, att, rev)
    if key.startswith(keys.ASSIGNMENTS):
        return m.set_assignment(doc if isinstance(doc, Assignment) else Assignment.model_validate_json(value), rev)
    return _put_replica_key(m, key, value, rev)


def _put_replica_key(m: Mirror, key: str, value: bytes, rev: int) -> Change:
    if key == keys.CLUSTER:
        m.cluster_marker = json.loads(value)
        return "cluster", ""
    if key == keys.LEADER:
        m.leader = value
        return "leader", ""
    if key.startswith(keys.REPLICAS):
        m.replicas[key.removeprefix(keys.REPLICAS)] = str(json.loads(value).get("address", ""))
        return "replicas", ""
    if key == keys.SHARDS:
        m.shards = (decode_members(value), rev)
        return "shards", ""
    return NO_CHANGE


def _drop_document(m: Mirror, key: str) -> Change:
    if key.startswith(keys.WORKLOADS):
        return m.drop_workload(key.removeprefix(keys.WORKLOADS))
    if key.startswith(keys.STATUS):
        return m.drop_status(key.removeprefix(keys.STATUS))
    if key.startswith(keys.NODES):
        return m.drop_node(key.removeprefix(keys.NODES))
    if key.startswith(keys.VOLUMES):
        return m.drop_volume(key.removeprefix(keys.VOLUMES))
    if key.startswith(keys.ATTACHMENTS):
        return m.drop_attachment(*keys.parse_attachment(key))
    if key.startswith(keys.ASSIGNMENTS):
        return m.drop_assignment(*keys.parse_assignment(key))
    return _drop_replica_key(m, key)


def _drop_replica_key(m: Mirror, key: str) -> Change:
    if key == keys.CLUSTER:
        m.cluster_marker = None
        return "cluster", ""
    if key == keys.LEADER:
        m.leader = None
        return "leader", ""
    if key.startswith(keys.REPLICAS):
        m.replicas.pop(key.removeprefix(keys.REPLICAS), None)
        return "replicas", ""
    if key == keys.SHARDS:
        m.shards = ((), 0)
        return "shards", ""
    return NO_CHANGE


def _index_revision(m: Mirror, key: str, present: bool) -> None:
    parsed = keys.parse_revision(key)
    if parsed is not None:
        m.index_revision(parsed[0], parsed[1], present)
