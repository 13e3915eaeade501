"""The built-in secret store: envelope-encrypted records inside the scheduler's state store
(SQLite or etcd) under their own prefix, outside `/persys/`, so the state mirror does not follow
them and backups neither carry nor restore them. The master key stays in its key file.

One record per secret, `/persys-secrets/<name>`: its name, key names, version and times in
clear (what listings show), the values only as the envelope's ciphertext.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from persys.secrets.base import (
    MAX_SECRETS,
    SecretExists,
    SecretInfo,
    SecretNotFound,
    SecretStoreError,
    SecretUnavailable,
    check_data,
    check_name,
)
from persys.secrets.envelope import open_sealed, seal
from persys.store.base import KeyValue, StateStore, StoreError

PREFIX = "/persys-secrets/"
# The id of the master key the records are sealed under (outside PREFIX: never listed as a secret).
KEY_ID_KEY = "/persys-secrets-key-id"
CAS_ATTEMPTS = 10
log = logging.getLogger(__name__)


class MasterKeyMismatch(SecretStoreError):
    """This replica's master key is not the one the stored secrets are sealed under."""


def key_id(master: bytes) -> str:
    """A public fingerprint of the master key (an HMAC, so it reveals nothing of the key)."""
    return hmac.new(master, b"persys secrets master key id", hashlib.sha256).hexdigest()[:16]


def _info(doc: dict[str, Any]) -> SecretInfo:
    return SecretInfo(doc["name"], tuple(doc["keys"]), int(doc["version"]), float(doc["createdAt"]),
                      float(doc["updatedAt"]))


class BuiltinSecretStore:
    backend = "builtin"

    def __init__(self, store: StateStore, master_key: bytes, keyfile: Path | None = None) -> None:
        self.store = store
        self._master = master_key
        self.keyfile = keyfile  # where the key came from, for error messages

    async def check_master_key(self) -> None:
        """Fail closed when another replica sealed the stored secrets under a different key (each
        replica made its own key file): this one could read none of them, nor the token pepper.
        The first replica records its key's id; with the store unreachable the check waits for
        the first use (a wrong key then fails each read with a clear error)."""
        mine = key_id(self._master)
        try:
            kv = await self.store.get(KEY_ID_KEY)
            if kv is None and await self.store.cas(KEY_ID_KEY, mine.encode(), 0) is not None:
                return
            kv = kv or await self.store.get(KEY_ID_KEY)
        except StoreError as err:
            log.warning("secrets: master key not checked against the store (%s)", err)
            return
        if kv is not None and kv.value.decode() != mine:
            raise MasterKeyMismatch(
                f"--secrets: the stored secrets are sealed under master key {kv.value.decode()}, but "
                f"{self.keyfile or 'this replica'} holds key {mine}: every replica needs the same key "
                "file (copy the first replica's, or pass --secrets builtin:KEYFILE)")

    async def _read(self, name: str) -> tuple[dict[str, Any], KeyValue] | None:
        check_name(name)
        try:
            kv = await self.store.get(PREFIX + name)
        except StoreError as err:
            raise SecretUnavailable(f"state store unavailable: {err}") from None
        return (json.loads(kv.value), kv) if kv is not None else None

    async def _write(self, name: str, data: Mapping[str, bytes], create_only: bool) -> int:
        check_name(name)
        check_data(data)
        for _ in range(CAS_ATTEMPTS):
            found = await self._read(name)
            if found is not None and create_only:
                raise SecretExists(f"secret {name} exists")
            old, kv = found or ({}, None)
            now = time.time()
            version = int(old.get("version", 0)) + 1
            doc = {"name": name, "keys": sorted(data), "version": version,
                   "createdAt": old.get("createdAt", now), "updatedAt": now,
                   "sealed": seal(self._master, name, version, data)}
            try:
                ok = await self.store.cas(PREFIX + name, json.dumps(doc).encode(), kv.mod_revision if kv else 0)
            except StoreError as err:
                raise SecretUnavailable(f"state store unavailable: {err}") from None
            if ok is not None:
                return version
        raise SecretUnavailable(f"secret {name} is being changed concurrently; try again")

    async def put(self, name: str, data: Mapping[str, bytes]) -> int:
        return await self._write(name, data, create_only=False)

    async def create(self, name: str, data: Mapping[str, bytes]) -> int:
        return await self._write(name, data, create_only=True)

    async def get(self, name: str, version: int | None = None) -> tuple[dict[str, bytes], int]:
        found = await self._read(name)
        if found is None:
            raise SecretNotFound(f"secret {name} not found")
        doc = found[0]
        current = int(doc["version"])
        if version is not None and version != current:
            raise SecretNotFound(f"secret {name} version {version} not found (the built-in store keeps the "
                                 f"current version, {current})")
        return open_sealed(self._master, name, current, doc["sealed"]), current

    async def info(self, name: str) -> SecretInfo:
        found = await self._read(name)
        if found is None:
            raise SecretNotFound(f"secret {name} not found")
        return _info(found[0])

    async def delete(self, name: str) -> bool:
        check_name(name)
        try:
            return await self.store.delete(PREFIX + name)
        except StoreError as err:
            raise SecretUnavailable(f"state store unavailable: {err}") from None

    async def list(self) -> list[SecretInfo]:
        try:
            kvs, _ = await self.store.range(PREFIX)
        except StoreError as err:
            raise SecretUnavailable(f"state store unavailable: {err}") from None
        return [_info(json.loads(kv.value)) for kv in kvs[:MAX_SECRETS]]

    async def names(self) -> tuple[str, ...]:
        return tuple(i.name for i in await self.list())

    async def close(self) -> None:
        return None  # the state store belongs to the scheduler
