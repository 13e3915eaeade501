"""LocalState: the agent's SQLite memory of desired and applied workloads."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from persys.agent.localstate import LocalState


def test_roundtrip_update_and_forget(tmp_path: Path) -> None:
    db = tmp_path / "agent" / "state.db"
    st = LocalState(db)
    spec = json.dumps({"type": "process", "process": {"command": ["sleep", "1"]}})
    st.save_desired("web", "abc", 1, "Running", spec)
    st.save_desired("job", "def", 3, "Stopped", "{}")
    d = st.desired()
    assert set(d) == {"web", "job"}
    assert d["web"].revision == "abc" and d["web"].generation == 1
    assert d["web"].desired_state == "Running" and json.loads(d["web"].spec_json) == json.loads(spec)

    st.save_desired("web", "xyz", 2, "Stopped", "{}")  # upsert, not duplicate
    d = st.desired()
    assert len(d) == 2 and d["web"].revision == "xyz" and d["web"].generation == 2

    st.save_desired("raw", "r", 1, "Running", b'{"a": 1}')  # Model.to_json() bytes are accepted
    assert st.desired()["raw"].spec_json == '{"a": 1}'
    st.forget("raw")

    st.save_applied("web", "xyz", 2, "process", "1234")
    assert st.applied()["web"].runtime_id == "1234"

    st.forget("web")
    st.forget("never-known")  # idempotent
    assert set(st.desired()) == {"job"} and st.applied() == {}
    st.close()


def test_survives_restart(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with LocalState(db) as st:
        st.save_desired("web", "abc", 5, "Running", '{"x": 1}')
        st.save_applied("web", "abc", 5, "container", "deadbeef")
        st.save_restarts("web", 3)
        st.save_restarts("job", 1)
        st.save_restarts("job", 0)  # 0: nothing to remember
    with LocalState(db) as st2:  # a restarted agent
        assert st2.desired()["web"].generation == 5
        assert st2.applied()["web"].runtime_id == "deadbeef"
        assert st2.restarts() == {"web": 3}  # reported as before, not 0 (persys dev restarts)
        st2.forget("web")
        assert st2.restarts() == {}


def test_usable_from_threads(tmp_path: Path) -> None:
    """The agent calls it through asyncio.to_thread, i.e. from varying worker threads."""
    st = LocalState(tmp_path / "state.db")

    def writer(i: int) -> None:
        for j in range(20):
            st.save_desired(f"w{i}-{j}", "r", j, "Running", "{}")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(st.desired()) == 80
    st.close()


def _filled(db: Path) -> None:
    st = LocalState(db)
    for i in range(200):  # several pages, so half the file cuts through table data
        st.save_desired(f"w{i}", "r" * 40, 1, "Running", json.dumps({"pad": "x" * 200}))
        st.save_applied(f"w{i}", "r" * 40, 1, "process", str(1000 + i))
    st.close()


def _bad_header(db: Path) -> None:
    data = bytearray(db.read_bytes())
    data[:16] = b"not a database!!"
    db.write_bytes(bytes(data))


def _half_truncated(db: Path) -> None:
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.truncate(size // 2)


@pytest.mark.parametrize("corrupt", [_bad_header, _half_truncated], ids=["bad header", "half truncated"])
def test_corrupt_file_is_moved_aside_and_rebuilt(tmp_path: Path, corrupt: Callable[[Path], None]) -> None:
    db = tmp_path / "agent.db"
    _filled(db)
    corrupt(db)
    original = db.read_bytes()
    st = LocalState(db)
    assert st.moved_aside is not None and st.moved_aside.name.startswith("agent.db.corrupt-")
    assert st.moved_aside.read_bytes() == original  # kept for inspection, untouched
    assert st.desired() == {} and st.applied() == {}  # rebuilt, as from an empty file
    st.save_desired("web", "r1", 1, "Running", "{}")
    st.close()
    again = LocalState(db)
    assert again.moved_aside is None and set(again.desired()) == {"web"}
    again.close()


def test_empty_file_is_not_corrupt(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    db.write_bytes(b"")
    st = LocalState(db)
    assert st.moved_aside is None and st.desired() == {}
    st.close()
    assert [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == []
