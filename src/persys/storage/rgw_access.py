"""The scheduler's RGW admin client from the `rgw:` section of its `--storage` file: the admin
secret key read from `secretKeyFile`, which only its owner may read (0600 or 0400), and kept in
memory only."""

from __future__ import annotations

import os
import stat

from persys.storage.base import StorageError
from persys.storage.config import RgwConfig
from persys.storage.rgw import RgwAdmin

MAX_KEY_FILE = 4096


def read_secret_key_file(path: str) -> str:
    """The key in `path` (surrounding whitespace dropped); a StorageError naming the field when
    the file is missing, readable by others, or not one line of key."""
    where = "storage.rgw.secretKeyFile"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as err:
        raise StorageError(f"{where}: {path}: {err.strerror or err}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"{where}: {path} is not a regular file")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise StorageError(f"{where}: {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                               "make it 0600 or 0400")
        if st.st_uid not in (0, os.geteuid()):
            raise StorageError(f"{where}: {path} belongs to uid {st.st_uid}, neither root nor this process's user")
        raw = f.read(MAX_KEY_FILE + 1)
    try:
        key = raw.decode().strip()
    except UnicodeDecodeError:
        raise StorageError(f"{where}: {path} does not hold a key (not text)") from None
    if not key or len(raw) > MAX_KEY_FILE or any(c.isspace() for c in key):
        raise StorageError(f"{where}: {path} does not hold one key (one line, no spaces)")
    return key


def open_rgw(cfg: RgwConfig, timeout_s: float = 30.0) -> RgwAdmin:
    return RgwAdmin(cfg.endpoint, cfg.access_key, read_secret_key_file(cfg.secret_key_file), timeout_s=timeout_s)
