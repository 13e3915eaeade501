"""One contract, every backend: what a SecretStore promises (tests/secrets/conftest.py gives
the built-in store on SQLite and OpenBao KV v2 on a real server)."""

from __future__ import annotations

import asyncio

import pytest

from persys.secrets.base import (
    MAX_VALUE_BYTES,
    SecretExists,
    SecretInvalid,
    SecretNotFound,
    SecretStore,
)


async def test_put_get_versions_and_bytes(secret_store: SecretStore) -> None:
    binary = bytes(range(256))
    assert await secret_store.put("db", {"password": b"s3cret", "blob": binary}) == 1
    assert await secret_store.get("db") == ({"password": b"s3cret", "blob": binary}, 1)
    assert await secret_store.put("db", {"password": b"rotated"}) == 2  # a put replaces every key
    assert await secret_store.get("db") == ({"password": b"rotated"}, 2)
    assert await secret_store.get("db", version=2) == ({"password": b"rotated"}, 2)
    with pytest.raises(SecretNotFound):
        await secret_store.get("db", version=7)


async def test_listing_shows_names_keys_versions_never_values(secret_store: SecretStore) -> None:
    await secret_store.put("b-second", {"k": b"value-b"})
    await secret_store.put("a-first", {"user": b"u", "password": b"value-a"})
    await secret_store.put("a-first", {"user": b"u", "password": b"value-a2"})
    listed = await secret_store.list()
    assert [(i.name, i.keys, i.version) for i in listed] == [("a-first", ("password", "user"), 2),
                                                            ("b-second", ("k",), 1)]
    assert all(i.created_at > 0 and i.updated_at >= i.created_at for i in listed)
    assert "value" not in repr(listed)
    assert await secret_store.names() == ("a-first", "b-second")
    info = await secret_store.info("a-first")
    assert (info.keys, info.version) == (("password", "user"), 2)


async def test_delete_and_missing(secret_store: SecretStore) -> None:
    await secret_store.put("gone", {"k": b"v"})
    assert await secret_store.delete("gone") is True
    assert await secret_store.delete("gone") is False
    for call in (secret_store.get("gone"), secret_store.info("gone")):
        with pytest.raises(SecretNotFound):
            await call
    assert await secret_store.list() == []
    assert await secret_store.put("gone", {"k": b"again"}) == 1  # a new secret starts over


async def test_create_only_once_even_when_racing(secret_store: SecretStore) -> None:
    results = await asyncio.gather(*(secret_store.create("persys/system/pepper", {"v": bytes([i])})
                                     for i in range(4)), return_exceptions=True)
    assert sum(1 for r in results if r == 1) == 1
    assert all(isinstance(r, SecretExists) for r in results if r != 1)
    assert [i.name for i in await secret_store.list()] == ["persys/system/pepper"]


@pytest.mark.parametrize(("name", "data", "field"), [
    ("Bad_Name", {"k": b"v"}, "metadata.name"),
    ("persys/other/x", {"k": b"v"}, "metadata.name"),
    ("ok", {}, "data"),
    ("ok", {"bad key": b"v"}, "data.bad key"),
    ("ok", {"k": b"x" * (MAX_VALUE_BYTES + 1)}, "data.k"),
    ("ok", {f"k{i}": b"x" * 60_000 for i in range(5)}, "data:"),
    ("ok", {f"k{i}": b"" for i in range(65)}, "data:"),
])
async def test_bounds_refused_naming_the_field_nothing_written(secret_store: SecretStore, name: str,
                                                               data: dict[str, bytes], field: str) -> None:
    with pytest.raises(SecretInvalid, match=field):
        await secret_store.put(name, data)
    assert await secret_store.list() == []
