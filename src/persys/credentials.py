"""Where a backend password comes from, and how it is kept out of sight: a leaf every layer may import.

A password is never given on the command line or in a URL (both end up in `ps`, shell history
and logs). It is named by a reference, resolved when the process starts:

  file:PATH         the file's content, one trailing newline removed (mode 0600 recommended)
  env:NAME          the environment variable NAME
  secret:NAME/KEY   key KEY of secret NAME in a secret store, through a `SecretResolver`

The resolved value is a `Password`, whose str() and repr() print `***`, so formatting one into
a message or a log line by mistake leaks nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urlsplit

# A password longer than this is a mistake (a wrong file named), not a password.
MAX_PASSWORD_BYTES = 4096
_SECRET_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
SCHEMES = ("file", "env", "secret")


class CredentialError(ValueError):
    """A credential reference that is malformed or cannot be resolved; the text names the option."""


class Password:
    """A resolved secret value that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The value, for the one call that sends it to the server."""
        return self._value

    def __repr__(self) -> str:
        return "Password(***)"

    def __str__(self) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Password) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True, slots=True)
class Login:
    """A backend user and its password (etcd user, Redis ACL user).

    `reread` reads the password again from where it came from (file: and env: references): a
    backend that refuses the password in memory is tried once more with the current one, so a
    rotated password file takes effect without a restart."""

    user: str
    password: Password
    reread: Callable[[], Password] | None = field(default=None, compare=False)

    def current(self) -> Login | None:
        """This login with the password as it reads now, if that differs (else None)."""
        if self.reread is None:
            return None
        try:
            fresh = self.reread()
        except CredentialError:
            return None  # unreadable now: keep what we have
        return None if fresh == self.password else Login(self.user, fresh, self.reread)


@dataclass(frozen=True, slots=True)
class CredentialRef:
    """Where a password is read from: `file:PATH`, `env:NAME` or `secret:NAME/KEY`."""

    scheme: Literal["file", "env", "secret"]
    target: str

    def __str__(self) -> str:  # a reference is not secret: it says where, not what
        return f"{self.scheme}:{self.target}"


class SecretResolver(Protocol):
    """The secret store's side of `secret:NAME/KEY` references.

    The scheduler takes one (start_scheduler(secrets=...)) and resolves its backend credentials
    through it before opening the store. It must not itself depend on the backend whose password
    it gives: an etcd password cannot come from a secret store kept in that etcd. Raise
    LookupError when the secret or key does not exist.
    """

    async def resolve_secret(self, name: str, key: str) -> bytes: ...


def parse_ref(text: str, option: str) -> CredentialRef:
    """A reference from an option's value; anything else (a password itself) is refused."""
    scheme, sep, target = text.partition(":")
    if not sep or scheme not in SCHEMES:
        raise CredentialError(
            f"{option}: expected a reference file:PATH, env:NAME or secret:NAME/KEY, not a password itself "
            "(a password on the command line is visible to every user of this machine)")
    if not target:
        raise CredentialError(f"{option}: {scheme}: needs a {'path' if scheme == 'file' else 'name'}")
    if scheme == "env" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", target):
        raise CredentialError(f"{option}: env:{target[:64]!r} is not an environment variable name")
    if scheme == "secret":
        name, slash, key = target.partition("/")
        if not slash or not _SECRET_PART.fullmatch(name) or not _SECRET_PART.fullmatch(key):
            raise CredentialError(f"{option}: secret: references read secret:NAME/KEY")
    return CredentialRef(scheme, target)  # type: ignore[arg-type]


def _checked(raw: bytes, option: str, where: str) -> Password:
    if len(raw) > MAX_PASSWORD_BYTES:
        raise CredentialError(f"{option}: {where} holds more than {MAX_PASSWORD_BYTES} bytes; is it the right one?")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise CredentialError(f"{option}: {where} is not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise CredentialError(f"{option}: {where} is empty")
    if any(c in text for c in "\r\n\0"):
        raise CredentialError(f"{option}: {where} holds more than one line")
    return Password(text)


def read_local(ref: CredentialRef, option: str) -> Password:
    """Resolve a `file:` or `env:` reference (no secret store needed)."""
    if ref.scheme == "file":
        path = Path(ref.target)
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_PASSWORD_BYTES + 1)
        except OSError as e:
            raise CredentialError(f"{option}: cannot read {path}: {e.strerror or e}") from None
        return _checked(raw, option, str(path))
    if ref.scheme == "env":
        value = os.environ.get(ref.target)
        if value is None:
            raise CredentialError(f"{option}: environment variable {ref.target} is not set")
        return _checked(value.encode(), option, f"${ref.target}")
    raise CredentialError(f"{option}: {ref} is not a local reference")


async def resolve(ref: CredentialRef, option: str, secrets: SecretResolver | None) -> Password:
    """The password a reference names. Errors name the option and the reference, never a value."""
    if ref.scheme != "secret":
        return read_local(ref, option)
    if secrets is None:
        raise CredentialError(
            f"{option}: {ref} needs a secret store, and this process has none configured "
            "(use file:PATH or env:NAME, or start it with a secret store that does not live in this backend)")
    name, _, key = ref.target.partition("/")
    try:
        raw = await secrets.resolve_secret(name, key)
    except LookupError:
        raise CredentialError(f"{option}: {ref}: no such secret or key") from None
    return _checked(raw, option, str(ref))


def url_password_problem(url: str, option: str, password_option: str) -> str | None:
    """A URL that carries a password is refused, with how to pass the password instead."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return None  # not parseable as a URL: the backend's own check names the problem
    if password is None:
        return None
    return (f"{option}: the URL holds a password; remove it and pass it with {password_option}-file FILE "
            f"or {password_option} file:PATH|env:NAME|secret:NAME/KEY")
