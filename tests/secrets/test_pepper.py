"""The API tokens' pepper lives in the secret store: made once (replicas racing agree on one),
never listed to clients; token records made with it are HMACs, older bare-sha256 ones still work."""

from __future__ import annotations

import asyncio
from pathlib import Path

from persys.scheduler.access.token_pepper import NAME, TokenPepper
from persys.scheduler.access.tokens import TokenStore
from persys.scheduler.rpc.secrets import listing
from persys.secrets.builtin import BuiltinSecretStore
from persys.secrets.keyfile import load_or_create
from persys.security.tokens import new_token, verify
from persys.store import open_store


async def test_pepper_made_once_and_tokens_use_it(tmp_path: Path) -> None:
    state = open_store(f"sqlite:///{tmp_path}/state.db")
    secrets = BuiltinSecretStore(state, load_or_create(tmp_path / "secrets.key"))
    try:
        peppers = await asyncio.gather(*(TokenPepper(secrets)() for _ in range(3)))  # three replicas
        assert len(set(peppers)) == 1 and len(peppers[0]) == 32
        assert [i.name for i in await secrets.list()] == [NAME]
        assert listing(await secrets.list(), with_keys=True) == []  # clients never see it

        tokens = TokenStore(state, TokenPepper(secrets))
        secret, record = await tokens.create("ci", "viewer", 60, "user:admin")
        assert record.peppered
        identity, credential = await tokens.authenticate(secret)
        assert identity.principal == "user:ci" and credential == f"token {record.id}"
        _, _, token_secret = secret.split("_", 2)
        assert verify(record, token_secret, record.created_at) == "unknown token"  # useless without pepper
        assert verify(record, token_secret, record.created_at, peppers[0]) == ""
    finally:
        await state.close()


def test_records_from_before_the_pepper_still_verify() -> None:
    secret, old = new_token("ci", "viewer", 60, "user:admin", 1000.0)
    _, _, token_secret = secret.split("_", 2)
    assert not old.peppered
    assert verify(old, token_secret, 1001.0, b"p" * 32) == ""
