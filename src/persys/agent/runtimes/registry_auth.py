"""The node's registry credentials (`persys agent --registry-auth FILE`): Docker's config.json
`auths` shape, read at pull time (a changed file applies to the next pull without a restart).

    {"auths": {"registry.example:5000": {"auth": "<base64 of user:password>"},
               "https://index.docker.io/v1/": {"username": "u", "password": "p"},
               "ghcr.io": {"identitytoken": "..."}}}

The file must be the agent's alone (mode 0600 or stricter). Its values never reach a log line, an
error message, an event or a status: errors name the file and the problem only.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from persys.agent.runtimes.base import RuntimeFailure

DOCKER_HUB = "docker.io"
_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
MAX_FILE_BYTES = 1024 * 1024
INVALID = "RegistryAuthInvalid"


def registry_of(image: str) -> str:
    """The registry host of an image reference, as Docker reads it: the first path component
    when it looks like a host (a '.' or ':' in it, or `localhost`), else Docker Hub."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return DOCKER_HUB if first in _HUB_ALIASES else first
    return DOCKER_HUB


def workload_credentials(image: str, delivered: Mapping[str, bytes]) -> dict[str, str] | None:
    """The credentials a workload's spec.secrets.registryAuth delivered for the image's registry
    (registry host -> JSON {"username", "password"}); None when it names none for it."""
    registry = registry_of(image)
    for host, raw in delivered.items():
        if (DOCKER_HUB if host.lower() in _HUB_ALIASES else host.lower()) == registry.lower():
            try:
                pair = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                return None  # the scheduler wrote it; never fall back to printing what it holds
            if isinstance(pair, dict) and isinstance(pair.get("username"), str) and \
                    isinstance(pair.get("password"), str):
                return {"username": pair["username"], "password": pair["password"]}
    return None


def qualified(image: str) -> str:
    """The reference with its registry spelled out (`busybox` -> `docker.io/library/busybox`):
    credentials go with a named registry."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"{DOCKER_HUB}/{image}" if sep else f"{DOCKER_HUB}/library/{image}"


def _host_of_key(key: str) -> str:
    """An `auths` key (`https://index.docker.io/v1/`, `registry:5000`, `http://host/`) as a host."""
    host = key.strip()
    for scheme in ("https://", "http://"):
        if host.startswith(scheme):
            host = host[len(scheme):]
    host = host.split("/", 1)[0]
    return DOCKER_HUB if host in _HUB_ALIASES else host


def fingerprint(path: Path | None) -> str | None:
    """What changes when the file does (inode, size, modification time): a terminal pull failure
    is retried once this differs. None without a file configured; "absent" while it is missing."""
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return "absent"
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def _invalid(path: Path, problem: str) -> RuntimeFailure:
    return RuntimeFailure(f"--registry-auth {path}: {problem}", code=INVALID, terminal=True,
                          credentials=fingerprint(path))


def _read(path: Path) -> dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as err:
        raise _invalid(path, f"cannot be read ({err.strerror or err})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _invalid(path, "is not a regular file")
        if st.st_mode & 0o077:
            raise _invalid(path, f"mode {stat.S_IMODE(st.st_mode):04o} lets others read it: chmod 600 {path}")
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise _invalid(path, "larger than 1 MiB")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _invalid(path, "not valid JSON (Docker's config.json shape: {\"auths\": {...}})") from None
    auths = doc.get("auths") if isinstance(doc, dict) else None
    if not isinstance(auths, dict):
        raise _invalid(path, "has no \"auths\" object (Docker's config.json shape: {\"auths\": {...}})")
    return auths


def _header(path: Path, key: str, entry: object) -> dict[str, str]:
    """What the engine takes as X-Registry-Auth (aiodocker encodes it) for one `auths` entry."""
    if not isinstance(entry, dict):
        raise _invalid(path, f"auths[{key!r}] is not an object")
    if isinstance(entry.get("identitytoken"), str) and entry["identitytoken"]:
        return {"identitytoken": entry["identitytoken"]}
    if isinstance(entry.get("auth"), str) and entry["auth"]:
        try:
            user, sep, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise _invalid(path, f"auths[{key!r}].auth is not base64 of user:password") from None
        if not sep:
            raise _invalid(path, f"auths[{key!r}].auth is not base64 of user:password")
        return {"username": user, "password": password}
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return {"username": entry["username"], "password": entry["password"]}
    raise _invalid(path, f"auths[{key!r}] has none of auth, username+password or identitytoken")


class RegistryAuth:
    """The credentials file of one node."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"RegistryAuth({str(self.path)!r})"  # the path only, never what it holds

    def fingerprint(self) -> str | None:
        return fingerprint(self.path)

    def for_image(self, image: str) -> dict[str, str] | None:
        """The credentials for the image's registry (None: the file names none for it). Reads
        the file now; a problem with it is a terminal RuntimeFailure naming the file."""
        registry = registry_of(image)
        auths = _read(self.path)
        for key, entry in auths.items():
            if _host_of_key(str(key)) == registry:
                return _header(self.path, str(key), entry)
        return None
