"""Choosing the scheduler's secret store (`persys scheduler --secrets`):

  builtin[:KEYFILE]   the built-in envelope in the state store; the master key in KEYFILE
                      (default <data dir>/secrets.key, created 0600 on first use)
  openbao | vault     KV v2 on Vault/OpenBao, configured from the environment:
                      PERSYS_BAO_ADDR (or VAULT_ADDR), PERSYS_BAO_MOUNT (default secret),
                      PERSYS_BAO_PREFIX (default persys), PERSYS_BAO_CACERT, and credentials from
                      files only: PERSYS_BAO_TOKEN_FILE, or PERSYS_BAO_ROLE_ID_FILE and
                      PERSYS_BAO_SECRET_ID_FILE (AppRole)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from persys.secrets.base import SecretStore, SecretStoreError
from persys.secrets.builtin import BuiltinSecretStore
from persys.secrets.keyfile import load_or_create
from persys.secrets.openbao import BaoSettings, OpenBaoSecretStore
from persys.store.base import StateStore


def bao_settings(env: Mapping[str, str]) -> BaoSettings:
    """OpenBao settings from environment variables (pure); SecretStoreError naming what is missing."""
    address = env.get("PERSYS_BAO_ADDR") or env.get("VAULT_ADDR", "")
    if not address:
        raise SecretStoreError("--secrets openbao: set PERSYS_BAO_ADDR (or VAULT_ADDR) to the server's URL")

    def path(var: str) -> Path | None:
        return Path(env[var]) if env.get(var) else None

    s = BaoSettings(address=address, mount=env.get("PERSYS_BAO_MOUNT", "secret"),
                    prefix=env.get("PERSYS_BAO_PREFIX", "persys").strip("/"),
                    token_file=path("PERSYS_BAO_TOKEN_FILE"), role_id_file=path("PERSYS_BAO_ROLE_ID_FILE"),
                    secret_id_file=path("PERSYS_BAO_SECRET_ID_FILE"), ca_file=path("PERSYS_BAO_CACERT"))
    if s.token_file is None and (s.role_id_file is None or s.secret_id_file is None):
        raise SecretStoreError("--secrets openbao: set PERSYS_BAO_TOKEN_FILE, or PERSYS_BAO_ROLE_ID_FILE and "
                               "PERSYS_BAO_SECRET_ID_FILE (credentials are read from files only)")
    return s


def open_secret_store(spec: str, store: StateStore, default_keyfile: Path,
                      env: Mapping[str, str] | None = None) -> SecretStore:
    kind, _, arg = spec.partition(":")
    if kind == "builtin":
        keyfile = Path(arg) if arg else default_keyfile
        return BuiltinSecretStore(store, load_or_create(keyfile), keyfile)
    if kind in ("openbao", "vault") and not arg:
        return OpenBaoSecretStore(bao_settings(os.environ if env is None else env))
    raise SecretStoreError(f"--secrets: builtin[:KEYFILE], openbao or vault, not {spec!r}")
