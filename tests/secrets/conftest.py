"""A secret store per backend for the contract suite: the built-in one on an embedded SQLite
state store, and OpenBao KV v2 on the session's real `bao server -dev` (a mount of its own)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import hvac.exceptions
import pytest

from persys.secrets.base import SecretStore
from persys.secrets.builtin import BuiltinSecretStore
from persys.secrets.keyfile import load_or_create
from persys.secrets.openbao import BaoSettings, OpenBaoSecretStore
from persys.store import open_store
from tests.bao_server import BaoServer
from tests.waiting import eventually


def bao_kv_mount(bao: BaoServer) -> str:
    """A fresh KV v2 mount (uuid-named: tests share the session server)."""
    mount = f"kv-{uuid.uuid4().hex[:12]}"
    client = bao.client()
    client.sys.enable_secrets_engine("kv", path=mount, options={"version": "2"})

    # A new KV v2 mount first upgrades itself in the background and refuses requests meanwhile
    # ("Upgrading from non-versioned to versioned data"): the fast lane's first write met that
    # at load 10. Its answer to a read of a missing key (404) says the upgrade is over.
    def upgraded() -> bool:
        try:
            client.secrets.kv.v2.read_secret_version(path="upgrade-probe", mount_point=mount,
                                                     raise_on_deleted_version=True)
        except hvac.exceptions.InvalidPath:
            return True
        return True

    eventually(upgraded, 60, f"the KV v2 mount {mount} upgraded")
    return mount


def bao_token_file(bao: BaoServer, directory: Path) -> Path:
    path = directory / "bao.token"
    path.write_text(bao.root_token + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(params=["builtin", "openbao"])
async def secret_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SecretStore]:
    store: SecretStore
    if request.param == "builtin":
        state = open_store(f"sqlite:///{tmp_path}/state.db")
        store = BuiltinSecretStore(state, load_or_create(tmp_path / "secrets.key"))
        yield store
        await state.close()
    else:
        bao: BaoServer = request.getfixturevalue("bao_server")
        store = OpenBaoSecretStore(BaoSettings(bao.url, mount=bao_kv_mount(bao),
                                               token_file=bao_token_file(bao, tmp_path)))
        yield store
        await store.close()
