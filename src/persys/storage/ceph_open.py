"""The ceph-rbd driver from a node's storage configuration: its cephx key from the secret store
(the secret `secretName` names, delivered by the scheduler) or read from `keyFile` (root-only; a
bare key or a Ceph keyring), kept in memory for librbd and for QEMU's VM disks."""

from __future__ import annotations

import re
import stat
from pathlib import Path

from persys.storage.base import StorageError
from persys.storage.ceph_rbd import CephRbdDriver
from persys.storage.ceph_session import CephConfig as SessionConfig
from persys.storage.config import CephConfig

_KEYRING_LINE = re.compile(r"^\s*key\s*=\s*(\S+)\s*$", re.M)
MAX_KEY_FILE = 4096


def read_key_file(path: str) -> str:
    """The cephx key in `path`; StorageError naming the file when it is missing, readable by
    anyone but its owner, or holds no key (the key itself never appears in a message)."""
    p = Path(path)
    try:
        st = p.stat()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise StorageError(f"keyFile {path}: readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                               "make it 0600 or 0400")
        if st.st_size > MAX_KEY_FILE:
            raise StorageError(f"keyFile {path}: larger than {MAX_KEY_FILE} bytes: not a key")
        text = p.read_text()
    except OSError as err:
        raise StorageError(f"keyFile {path}: {err.strerror or err}") from None
    found = _KEYRING_LINE.search(text)
    key = found.group(1) if found else text.strip()
    if not key or any(c.isspace() for c in key):
        raise StorageError(f"keyFile {path}: holds no cephx key (a bare key, or a keyring's `key = ...` line)")
    return key


class NodeCephDriver(CephRbdDriver):
    """CephRbdDriver that hands QEMU its key for VM disks (`storage.base.DiskKeyed`)."""

    def disk_key(self) -> str:
        return self.config.key


class KeyPending(StorageError):
    """No keyFile: the key comes from the secret store (`secretName`), and has not come yet."""


def open_ceph(config: CephConfig, node_id: str, cluster_id: str = "", key: str | None = None) -> NodeCephDriver:
    """The driver with `key` (from the secret store), else the one in `keyFile`; its images are
    named with `cluster_id` (ceph_rbd.image_name)."""
    if key is None and not config.key_file:
        raise KeyPending(f"waiting for the cephx key from the secret store (secret {config.secret_name}, "
                         "entry 'key'); or give the node a keyFile")
    session = SessionConfig(monitors=config.monitors, user=config.user,
                            key=key if key is not None else read_key_file(config.key_file),
                            pool=config.pool, secret_name=config.secret_name, conf_path=config.conf)
    problems = session.problems()
    if problems:
        raise StorageError("; ".join(problems))
    return NodeCephDriver(node_id, session, cluster_id=cluster_id)
