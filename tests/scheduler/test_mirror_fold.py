"""The mirror is data and store events fold into it purely: no store, no loop."""

from __future__ import annotations

from persys.model import Assignment, Phase, WorkloadStatus
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.mirror import fold, keys
from persys.store.base import KeyValue, WatchEvent


def kv(key: str, value: bytes, rev: int) -> KeyValue:
    return KeyValue(key, value, rev, rev, 1)


def test_a_put_indexes_and_a_delete_unindexes() -> None:
    m = Mirror()
    a = Assignment(instance_id="web.1", node_id="n1", revision="r1", generation=1, desired_state="Running")
    assert fold.fold_put(m, keys.assignment("n1", "web.1"), a.to_json(), 3) == ("assignment", "n1/web.1")
    st = WorkloadStatus(phase=Phase.PENDING)
    assert fold.fold_put(m, keys.status("web.1"), st.to_json(), 4) == ("status", "web.1")
    assert m.placement_of == {"web.1": "n1"} and m.instances == {"web": {"web.1"}} and m.pending == {"web.1"}
    assert fold.fold_delete(m, keys.assignment("n1", "web.1"), 5) == ("assignment", "n1/web.1")
    assert m.placement_of == {} and m.instances == {"web": {"web.1"}}  # the status still names it
    assert fold.fold_delete(m, keys.status("web.1"), 6) == ("status", "web.1")
    assert m.instances == {} and m.pending == set()


def test_stale_events_change_nothing() -> None:
    m = Mirror()
    st = WorkloadStatus(phase=Phase.RUNNING)
    fold.fold_put(m, keys.status("web"), st.to_json(), 7)
    assert fold.fold_put(m, keys.status("web"), st.to_json(), 7) == fold.NO_CHANGE  # our own write, watched
    fold.fold_delete(m, keys.status("web"), 9)
    assert fold.fold_put(m, keys.status("web"), st.to_json(), 8) == fold.NO_CHANGE  # resurrection refused
    assert "web" not in m.statuses


def test_a_watch_event_moves_the_revision_and_a_snapshot_replaces() -> None:
    m = Mirror()
    st = WorkloadStatus(phase=Phase.RUNNING).to_json()
    fold.fold_event(m, WatchEvent("put", kv(keys.status("a"), st, 2), 2))
    assert m.revision == 2
    changes = fold.fold_snapshot(m, [kv(keys.status("b"), st, 5)], 6)
    assert sorted(changes) == [("status", "a"), ("status", "b")] and set(m.statuses) == {"b"} and m.revision == 6


def test_an_undecodable_document_is_skipped() -> None:
    m = Mirror()
    assert fold.fold_put(m, keys.node("n1"), b"[1, 2]", 3) == fold.NO_CHANGE
    assert m.nodes == {}
