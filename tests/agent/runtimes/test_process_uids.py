"""Per-workload user ids (process_isolation.py) and what `spec.process.user` means on a node
(run_as.py): pure parts as properties, the claim files on a real folder, no processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persys.agent.runtimes.base import RuntimeFailure
from persys.agent.runtimes.process_isolation import Isolation, UidClaims, parse_uid_range, pick_uid
from persys.agent.runtimes.run_as import resolve_user

ids = st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(wid=ids, lo=st.integers(1, 2**32 - 200), size=st.integers(1, 150), taken=st.sets(st.integers(0, 160)))
def test_pick_is_in_range_free_and_deterministic(wid: str, lo: int, size: int, taken: set[int]) -> None:
    hi = lo + size - 1
    used = {lo + t for t in taken}
    uid = pick_uid(wid, (lo, hi), used.__contains__)
    if set(range(lo, hi + 1)) <= used:
        assert uid is None
    else:
        assert uid is not None and lo <= uid <= hi and uid not in used
        assert pick_uid(wid, (lo, hi), used.__contains__) == uid


def test_claims_never_share_a_uid_and_skip_host_users(tmp_path: Path) -> None:
    host = {100, 101, 102}  # what the host's user or group tables know
    for agent in ("/agent-a", "/agent-b"):
        for w in "wxy":
            (Path(str(tmp_path) + agent) / w).mkdir(parents=True, exist_ok=True)
    a = UidClaims(tmp_path / "uids", str(tmp_path) + "/agent-a", (100, 107), host.__contains__)
    b = UidClaims(tmp_path / "uids", str(tmp_path) + "/agent-b", (100, 107), host.__contains__)
    got = [a.claim("w"), b.claim("w"), a.claim("x"), b.claim("x"), a.claim("y")]
    assert len(set(got)) == 5 and not set(got) & host and all(100 <= u <= 107 for u in got)
    assert a.claim("w") == got[0] and a.claim("w", recorded=got[0]) == got[0]  # kept: restarts, adoption
    with pytest.raises(RuntimeFailure, match="no free uid"):
        b.claim("y")  # the range is full
    a.release("w", got[0])
    b.release("x", got[2])  # not b's claim: nothing happens
    assert b.claim("y") == got[0]
    assert a.claim("x") == got[2]


def test_a_claim_whose_workload_is_gone_is_free_again(tmp_path: Path) -> None:
    (tmp_path / "gone-agent" / "w").mkdir(parents=True)
    old = UidClaims(tmp_path / "uids", str(tmp_path / "gone-agent"), (200, 200), lambda _: False)
    assert old.claim("w") == 200
    (tmp_path / "new" / "v").mkdir(parents=True)
    new = UidClaims(tmp_path / "uids", str(tmp_path / "new"), (200, 200), lambda _: False)
    with pytest.raises(RuntimeFailure):
        new.claim("v")  # still held: its workload's folder is there
    (tmp_path / "gone-agent" / "w").rmdir()
    assert new.claim("v") == 200


def test_the_record_round_trips() -> None:
    iso = Isolation(61200, 61200, "isolated", dynamic=True)
    assert Isolation.from_doc(iso.to_doc()) == iso
    assert Isolation.from_doc(None) is None and Isolation.from_doc({"uid": "x"}) is None


@pytest.mark.parametrize(("text", "ok"), [("61184-65519", (61184, 65519)), ("1-1", (1, 1)), ("0-10", None),
                                          ("10-9", None), ("5", None), ("a-b", None), ("1-4294967295", None)])
def test_uid_range(text: str, ok: tuple[int, int] | None) -> None:
    if ok is None:
        with pytest.raises(ValueError, match="FIRST"):
            parse_uid_range(text)
    else:
        assert parse_uid_range(text) == ok


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a root agent resolves users for others")
NODE = {"toor": 0, "app": 1234, "daemon": 1}.get  # the node's user table, for names


@root_only
@pytest.mark.parametrize(("user", "uid"), [("00", 0), ("0000000000", 0), ("root", 0), ("0", 0), ("app", 1234),
                                           ("0001234", 1234), ("4294967294", 4294967294)])
def test_users_a_node_runs_as(user: str, uid: int) -> None:
    assert resolve_user(user, names=NODE).uid == uid


@root_only
@pytest.mark.parametrize(("user", "code", "says"), [
    ("toor", "PolicyViolation", "is uid 0 (root) on this node"),
    ("4294967295", "InvalidSpec", "outside 0..4294967294"),
    ("4294967296", "InvalidSpec", "outside"),
    ("9999999999", "InvalidSpec", "outside"),
    ("nobody-here", "InvalidSpec", "does not exist"),
])
def test_users_a_node_refuses(user: str, code: str, says: str) -> None:
    with pytest.raises(RuntimeFailure) as caught:
        resolve_user(user, names=NODE)
    assert caught.value.terminal and caught.value.code == code
    assert says in str(caught.value) and "spec.process.user" in str(caught.value)
