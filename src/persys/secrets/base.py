"""The `SecretStore` interface, what a listing shows (`SecretInfo`: names, key names, versions,
times; never values), the errors, and the bounds every backend enforces the same way (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from persys.model.secret_refs import MAX_KEYS, MAX_SECRET_BYTES, MAX_VALUE_BYTES
from persys.model.secret_refs import SECRET_KEY_RE as KEY_RE
from persys.model.secret_refs import SECRET_NAME_RE as NAME_RE

# Workload secrets are named like workloads (a DNS label). The control plane's own secrets live
# under SYSTEM_PREFIX (`persys/system/token-pepper`, later RGW and cephx keys): the API refuses
# such names, so only the scheduler itself reads or writes them.
SYSTEM_PREFIX = "persys/system/"
MAX_SECRETS = 10_000  # secrets a store holds at most (the API refuses more); listed at once


class SecretStoreError(Exception):
    """Base of every secret store failure; messages never carry a value."""


class SecretNotFound(SecretStoreError):
    """No such secret (or no such version of it)."""


class SecretInvalid(SecretStoreError, ValueError):
    """A name, key or size outside the bounds; the message names the field."""


class SecretExists(SecretStoreError):
    """A create-only write found the secret already there."""


class SecretUnavailable(SecretStoreError):
    """The backend cannot be reached or refused our credentials."""


@dataclass(frozen=True, slots=True)
class SecretInfo:
    name: str
    keys: tuple[str, ...]
    version: int
    created_at: float
    updated_at: float

    def to_doc(self) -> dict[str, Any]:
        return {"name": self.name, "keys": list(self.keys), "version": self.version,
                "createdAt": self.created_at, "updatedAt": self.updated_at}


def is_system(name: str) -> bool:
    return name.startswith(SYSTEM_PREFIX)


def check_name(name: str, *, system_ok: bool = True) -> None:
    """Raise SecretInvalid unless `name` is a DNS label, or (`system_ok`) persys/system/<label>."""
    if system_ok and is_system(name) and NAME_RE.fullmatch(name[len(SYSTEM_PREFIX):]):
        return
    if not NAME_RE.fullmatch(name):
        raise SecretInvalid("metadata.name: a DNS label (lowercase letters, digits and '-', 1-63 characters, "
                            "starting and ending with a letter or digit)")


def check_data(data: Mapping[str, bytes]) -> None:
    """Raise SecretInvalid naming the first key or bound the data breaks."""
    if not data:
        raise SecretInvalid("data: at least one key")
    if len(data) > MAX_KEYS:
        raise SecretInvalid(f"data: {len(data)} keys, at most {MAX_KEYS}")
    total = 0
    for key, value in data.items():
        if not isinstance(key, str) or not KEY_RE.fullmatch(key):
            raise SecretInvalid(f"data.{str(key)[:64]!s}: a key is letters, digits, '-', '_' or '.' (1-253)")
        if not isinstance(value, bytes):
            raise SecretInvalid(f"data.{key}: bytes expected")
        if len(value) > MAX_VALUE_BYTES:
            raise SecretInvalid(f"data.{key}: {len(value)} bytes, at most {MAX_VALUE_BYTES}")
        total += len(value)
    if total > MAX_SECRET_BYTES:
        raise SecretInvalid(f"data: {total} bytes in all, at most {MAX_SECRET_BYTES}")


@runtime_checkable
class SecretStore(Protocol):
    """Every backend: async, values in bytes, versions counted from 1 by each put.

    Only the current version is guaranteed readable by number (the built-in keeps no older
    ones; OpenBao keeps what its mount's max_versions says)."""

    backend: str

    async def put(self, name: str, data: Mapping[str, bytes]) -> int:
        """Store `data` as the secret's new version (replacing every key); the version number."""
        ...

    async def create(self, name: str, data: Mapping[str, bytes]) -> int:
        """Like put, only if the secret does not exist yet (SecretExists otherwise)."""
        ...

    async def get(self, name: str, version: int | None = None) -> tuple[dict[str, bytes], int]:
        """The values and their version. SecretNotFound for a missing secret or version."""
        ...

    async def info(self, name: str) -> SecretInfo:
        """Keys and versions of one secret, no values. SecretNotFound if missing."""
        ...

    async def delete(self, name: str) -> bool:
        """Remove every version; False if there was nothing to remove."""
        ...

    async def list(self) -> list[SecretInfo]:
        """Every secret, sorted by name, without values."""
        ...

    async def names(self) -> tuple[str, ...]:
        """Every secret's name, sorted (cheaper than list: what a bound on their number needs)."""
        ...

    async def close(self) -> None: ...
