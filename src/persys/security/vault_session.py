"""A logged-in Vault/OpenBao client (hvac; its calls block: run them in a thread).

Services log in with AppRole: a role id (not secret, from a file or the environment) and a secret
id that reaches the machine response-wrapped (a single-use token naming it, so an interception
shows as the service's failure to unwrap). The wrapped secret id is unwrapped once at start and
its file overwritten and removed; the secret id itself stays in memory only, to log in again when
the Vault token expires.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import hvac
from hvac import exceptions as hvac_errors

from persys.security.bao_roles import APPROLE_MOUNT

T = TypeVar("T")
MAX_CREDENTIAL_BYTES = 4096
REQUEST_TIMEOUT = 5.0  # seconds: a stalled Vault must not hold a renewal for long


class VaultLoginError(Exception):
    """Logging in failed for a reason a retry will not fix (bad credentials, a used secret id)."""


def read_credential(path: Path, option: str) -> str:
    """A token or id from a file: bounded, one line, no surrounding whitespace."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise VaultLoginError(f"{option} {path}: {e.strerror}") from None
    text = raw.decode("utf-8", "replace").strip()
    if not text or len(raw) > MAX_CREDENTIAL_BYTES or any(c.isspace() for c in text):
        raise VaultLoginError(f"{option} {path}: expected one token of at most {MAX_CREDENTIAL_BYTES} bytes")
    return text


def _shred(path: Path) -> None:
    """Overwrite then remove: the file held a single-use credential that must not be found again."""
    try:
        size = path.stat().st_size
        with path.open("r+b") as f:
            f.write(b"\0" * size)
            f.flush()
            os.fsync(f.fileno())
    finally:
        path.unlink(missing_ok=True)


def new_client(url: str, ca_file: Path | None, token: str | None = None, timeout: float = REQUEST_TIMEOUT) -> Any:
    return hvac.Client(url=url, token=token, verify=str(ca_file) if ca_file else True, timeout=timeout)


def unwrap_secret_id(url: str, ca_file: Path | None, wrapped_file: Path, option: str) -> str:
    """The secret id inside the response-wrapping token in `wrapped_file`; the file is shredded
    once unwrapped. A token used before (or expired) fails with a clear error."""
    wrapping_token = read_credential(wrapped_file, option)
    client = new_client(url, ca_file, wrapping_token)
    try:
        answer = client.sys.unwrap()
    except (hvac_errors.Forbidden, hvac_errors.InvalidRequest) as e:
        raise VaultLoginError(
            f"{option} {wrapped_file}: the wrapped secret id was already used or has expired ({_reason(e)}); "
            "issue a new one with `persys certs vault-secret-id`") from None
    secret_id = (answer.get("data") or {}).get("secret_id") if isinstance(answer, dict) else None
    if not isinstance(secret_id, str) or not secret_id:
        raise VaultLoginError(f"{option} {wrapped_file}: the wrapping token does not hold an AppRole secret id")
    _shred(wrapped_file)
    return secret_id


def _reason(e: Exception) -> str:
    errors = getattr(e, "errors", None)
    return "; ".join(str(x) for x in errors)[:200] if errors else type(e).__name__


class VaultSession:
    """One hvac client, logged in again when its token is refused (expired or revoked)."""

    def __init__(self, url: str, ca_file: Path | None, *, token: str | None = None,
                 approle: tuple[str, str] | None = None, approle_mount: str = APPROLE_MOUNT,
                 timeout: float = REQUEST_TIMEOUT) -> None:
        self.url = url
        self._timeout = timeout
        self._ca = ca_file
        self._approle = approle
        self._mount = approle_mount
        self._lock = threading.Lock()
        self._client = new_client(url, ca_file, token, timeout)
        if approle is not None:
            self._login()

    def _login(self) -> None:
        assert self._approle is not None
        role_id, secret_id = self._approle
        client = new_client(self.url, self._ca, timeout=self._timeout)
        try:
            client.auth.approle.login(role_id, secret_id, mount_point=self._mount)
        except (hvac_errors.InvalidRequest, hvac_errors.Forbidden) as e:
            raise VaultLoginError(f"AppRole login at {self.url} refused: {_reason(e)}") from None
        self._client = client

    def call(self, fn: Callable[[Any], T]) -> T:
        """`fn(client)`; once more after a fresh login if the token was refused."""
        with self._lock:
            client = self._client
        try:
            return fn(client)
        except hvac_errors.Forbidden:
            if self._approle is None:
                raise
            with self._lock:
                if self._client is client:
                    self._login()
                client = self._client
            return fn(client)
