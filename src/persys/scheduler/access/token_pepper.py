"""The API tokens' pepper: 32 random bytes in the secret store (`persys/system/token-pepper`),
created by the first replica that needs it. Token records then keep HMAC-SHA256(pepper, secret)
instead of a bare sha256, so a copy of the state store alone cannot test guesses offline."""

from __future__ import annotations

import asyncio
import os

from persys.secrets.base import SecretExists, SecretNotFound, SecretStore, SecretStoreError
from persys.store.base import StoreUnavailable

NAME = "persys/system/token-pepper"
KEY = "pepper"


class TokenPepper:
    def __init__(self, secrets: SecretStore) -> None:
        self.secrets = secrets
        self._value: bytes | None = None
        self._lock = asyncio.Lock()

    async def _read_or_create(self) -> bytes:
        try:
            return (await self.secrets.get(NAME))[0][KEY]
        except SecretNotFound:
            pass
        try:
            await self.secrets.create(NAME, {KEY: os.urandom(32)})
        except SecretExists:
            pass  # another replica was first: its pepper holds
        return (await self.secrets.get(NAME))[0][KEY]

    async def __call__(self) -> bytes:
        """The pepper (read once, then kept in memory); StoreUnavailable if it cannot be had."""
        if self._value is None:
            async with self._lock:
                if self._value is None:
                    try:
                        self._value = await self._read_or_create()
                    except (SecretStoreError, KeyError) as err:
                        raise StoreUnavailable(f"token pepper: {err}") from None
        return self._value
