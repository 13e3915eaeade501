"""The built-in store's master key: 32 random bytes in a file of mode 0600, created once.

Losing the file loses every built-in secret; it never goes into the state store or a backup.
"""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

from persys.secrets.base import SecretStoreError
from persys.secrets.envelope import KEY_BYTES


class KeyFileError(SecretStoreError):
    """The key file exists but holds no usable key."""


def load_or_create(path: Path) -> bytes:
    """The master key in `path` (base64 text), created (0600, parent 0700) when absent; a file
    others may read is tightened to 0600."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        _create(path)
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        os.chmod(path, 0o600)
    try:
        key = base64.b64decode(path.read_text().strip(), validate=True)
    except ValueError:
        raise KeyFileError(f"{path}: not a base64 key") from None
    if len(key) != KEY_BYTES:
        raise KeyFileError(f"{path}: a key of {KEY_BYTES} bytes expected, found {len(key)}")
    return key


def _create(path: Path) -> None:
    """Write a new key where no reader can see it half-written: a file of its own, complete and
    synced, then linked into place. Replicas starting together race here; the first link wins,
    the others find the file already there (whole) and read it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(os.urandom(KEY_BYTES)).decode() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic, and never replaces a key already there
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
