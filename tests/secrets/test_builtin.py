"""The built-in store at rest: the SQLite file (with its WAL and history) holds ciphertext only,
a record moved to another name or slot does not open, and the key file is made once, 0600."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from persys.secrets.builtin import PREFIX, BuiltinSecretStore, MasterKeyMismatch
from persys.secrets.envelope import EnvelopeError
from persys.secrets.keyfile import KeyFileError, load_or_create
from persys.store import open_store


def at_rest(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.glob("state.db*"))


async def test_sqlite_file_holds_no_value_and_records_cannot_be_moved(tmp_path: Path) -> None:
    state = open_store(f"sqlite:///{tmp_path}/state.db")
    store = BuiltinSecretStore(state, load_or_create(tmp_path / "secrets.key"))
    value = os.urandom(8).hex().encode()
    try:
        await store.put("a", {"k": value})
        await store.put("a", {"k": value + b"2"})  # history keeps the earlier record too
        await store.put("b", {"k": b"other"})
        blob = at_rest(tmp_path)
        assert b"/persys-secrets/a" in blob  # the records are there ...
        assert value not in blob and base64.b64encode(value) not in blob  # ... but no value

        a = await state.get(PREFIX + "a")
        b = await state.get(PREFIX + "b")
        assert a is not None and b is not None
        doc = json.loads(a.value)
        await state.put(PREFIX + "b", json.dumps({**doc, "name": "b"}).encode())  # a's record as b's
        with pytest.raises(EnvelopeError):
            await store.get("b")
        await state.put(PREFIX + "a", json.dumps({**doc, "version": 1}).encode())  # rolled back a version
        with pytest.raises(EnvelopeError):
            await store.get("a")
        other = BuiltinSecretStore(state, load_or_create(tmp_path / "other.key"))
        with pytest.raises(EnvelopeError):
            await other.get("a")
    finally:
        await state.close()


def test_key_file_made_once_private_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "secrets.key"
    key = load_or_create(path)
    assert len(key) == 32 and load_or_create(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    assert load_or_create(path) == key and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("c2hvcnQ=\n")
    with pytest.raises(KeyFileError, match="32 bytes"):
        load_or_create(path)


async def test_a_replica_with_another_master_key_is_refused(tmp_path: Path) -> None:
    """Each replica making its own key file would seal secrets no other replica can open: the
    first key's id is recorded, and a scheduler with another key refuses to start."""
    state = open_store(f"sqlite:///{tmp_path}/state.db")
    try:
        first = BuiltinSecretStore(state, load_or_create(tmp_path / "r0.key"), tmp_path / "r0.key")
        await first.check_master_key()
        await first.check_master_key()  # the same key again: fine (a restart)
        second = BuiltinSecretStore(state, load_or_create(tmp_path / "r1.key"), tmp_path / "r1.key")
        with pytest.raises(MasterKeyMismatch, match=r"r1\.key holds key .*every replica needs the same key file"):
            await second.check_master_key()
        assert await second.names() == ()  # the key id record is not a secret
    finally:
        await state.close()
