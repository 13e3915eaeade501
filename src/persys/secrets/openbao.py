"""The Vault/OpenBao secret store: KV version 2 through hvac (the same code serves HashiCorp
Vault). Every hvac call runs in a thread, off the event loop.

Secrets live at `<mount>/<prefix>/<name>`; values are base64 strings in KV (KV holds JSON
strings, secrets are bytes). Credentials come from files only: a token file, or an AppRole
role id and secret id (logged in again when the token is refused), never the command line.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import hvac
import hvac.exceptions as hx
import requests

from persys.secrets.base import (
    MAX_SECRETS,
    SYSTEM_PREFIX,
    SecretExists,
    SecretInfo,
    SecretNotFound,
    SecretStoreError,
    SecretUnavailable,
    check_data,
    check_name,
)

T = TypeVar("T")


@dataclass(frozen=True)
class BaoSettings:
    address: str
    mount: str = "secret"
    prefix: str = "persys"
    token_file: Path | None = None
    role_id_file: Path | None = None
    secret_id_file: Path | None = None
    ca_file: Path | None = None
    timeout: float = 10.0


def _time(text: Any) -> float:
    """RFC 3339 with up to nanoseconds (Vault's), as unix seconds."""
    if not isinstance(text, str) or not text:
        return 0.0
    head, _, frac = text.rstrip("Z").partition(".")
    stamp = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC)
    return stamp.timestamp() + (float("0." + frac) if frac.isdigit() else 0.0)


class OpenBaoSecretStore:
    backend = "openbao"

    def __init__(self, settings: BaoSettings) -> None:
        if settings.token_file is None and (settings.role_id_file is None or settings.secret_id_file is None):
            raise SecretStoreError("openbao: a token file, or an AppRole role id file and secret id file, is needed")
        self.settings = settings
        self._client: hvac.Client | None = None
        self._lock = threading.Lock()  # one login at a time

    # ------------------------------------------------------------------ credentials (in threads)

    def _login(self) -> hvac.Client:
        s = self.settings
        client = hvac.Client(url=s.address, verify=str(s.ca_file) if s.ca_file else True, timeout=s.timeout)
        if s.token_file is not None:
            client.token = s.token_file.read_text().strip()
        else:
            assert s.role_id_file is not None and s.secret_id_file is not None
            client.auth.approle.login(role_id=s.role_id_file.read_text().strip(),
                                      secret_id=s.secret_id_file.read_text().strip())
        return client

    def _client_now(self, fresh: bool) -> hvac.Client:
        with self._lock:
            if self._client is None or fresh:
                self._client = self._login()
            return self._client

    def _call(self, fn: Callable[[hvac.Client], T]) -> T:
        try:
            try:
                return fn(self._client_now(False))
            except (hx.Forbidden, hx.Unauthorized):
                return fn(self._client_now(True))  # an expired AppRole token: log in again, once
        except (SecretStoreError, hx.InvalidPath):
            raise
        except (hx.Forbidden, hx.Unauthorized) as err:
            raise SecretUnavailable(f"openbao refused our credentials: {type(err).__name__}") from None
        except (hx.VaultDown, hx.InternalServerError, hx.BadGateway, requests.RequestException, OSError) as err:
            raise SecretUnavailable(f"openbao unavailable at {self.settings.address}: {type(err).__name__}") from None

    async def _run(self, fn: Callable[[hvac.Client], T]) -> T:
        return await asyncio.to_thread(self._call, fn)

    def _path(self, name: str) -> str:
        return f"{self.settings.prefix}/{name}" if self.settings.prefix else name

    # ------------------------------------------------------------------ SecretStore

    async def _write(self, name: str, data: Mapping[str, bytes], cas: int | None) -> int:
        check_name(name)
        check_data(data)
        payload = {k: base64.b64encode(v).decode() for k, v in data.items()}

        def write(c: hvac.Client) -> int:
            try:
                r = c.secrets.kv.v2.create_or_update_secret(self._path(name), payload, cas=cas,
                                                            mount_point=self.settings.mount)
            except hx.InvalidRequest as err:
                if cas == 0 and "check-and-set" in str(err):
                    raise SecretExists(f"secret {name} exists") from None
                raise SecretStoreError(f"openbao refused the write of {name}: {type(err).__name__}") from None
            return int(r["data"]["version"])

        return await self._run(write)

    async def put(self, name: str, data: Mapping[str, bytes]) -> int:
        return await self._write(name, data, None)

    async def create(self, name: str, data: Mapping[str, bytes]) -> int:
        return await self._write(name, data, 0)

    async def get(self, name: str, version: int | None = None) -> tuple[dict[str, bytes], int]:
        check_name(name)

        def read(c: hvac.Client) -> tuple[dict[str, bytes], int]:
            try:
                r = c.secrets.kv.v2.read_secret_version(self._path(name), version=version,
                                                        mount_point=self.settings.mount,
                                                        raise_on_deleted_version=True)
            except hx.InvalidPath:
                what = f"secret {name}" + (f" version {version}" if version is not None else "")
                raise SecretNotFound(f"{what} not found") from None
            values = r["data"]["data"] or {}
            return {k: base64.b64decode(v) for k, v in values.items()}, int(r["data"]["metadata"]["version"])

        return await self._run(read)

    def _info_sync(self, c: hvac.Client, name: str) -> SecretInfo:
        try:
            meta = c.secrets.kv.v2.read_secret_metadata(self._path(name), mount_point=self.settings.mount)["data"]
            current = int(meta["current_version"])
            r = c.secrets.kv.v2.read_secret_version(self._path(name), version=current,
                                                    mount_point=self.settings.mount,
                                                    raise_on_deleted_version=True)
        except hx.InvalidPath:
            raise SecretNotFound(f"secret {name} not found") from None
        keys = tuple(sorted(r["data"]["data"] or {}))  # the values are dropped here, unread
        return SecretInfo(name, keys, current, _time(meta.get("created_time")), _time(meta.get("updated_time")))

    async def info(self, name: str) -> SecretInfo:
        check_name(name)
        return await self._run(lambda c: self._info_sync(c, name))

    async def delete(self, name: str) -> bool:
        check_name(name)

        def remove(c: hvac.Client) -> bool:
            try:
                c.secrets.kv.v2.read_secret_metadata(self._path(name), mount_point=self.settings.mount)
            except hx.InvalidPath:
                return False
            c.secrets.kv.v2.delete_metadata_and_all_versions(self._path(name), mount_point=self.settings.mount)
            return True

        return await self._run(remove)

    def _names(self, c: hvac.Client) -> list[str]:
        names: list[str] = []
        for folder in ("", SYSTEM_PREFIX):  # workload secrets, then the control plane's
            path = self._path(folder.rstrip("/")) if folder else self.settings.prefix
            try:
                keys = c.secrets.kv.v2.list_secrets(path, mount_point=self.settings.mount)["data"]["keys"]
            except hx.InvalidPath:
                continue
            names += [folder + k for k in keys if not k.endswith("/")]
        return sorted(names)[:MAX_SECRETS]

    async def list(self) -> list[SecretInfo]:
        def walk(c: hvac.Client) -> list[SecretInfo]:
            out = []
            for name in self._names(c):
                try:
                    out.append(self._info_sync(c, name))
                except SecretNotFound:
                    continue  # deleted meanwhile
            return out

        return await self._run(walk)

    async def names(self) -> tuple[str, ...]:
        return tuple(await self._run(self._names))

    async def close(self) -> None:
        if self._client is not None:
            await asyncio.to_thread(self._client.adapter.close)
