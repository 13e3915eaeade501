"""One node's connection to a Ceph cluster (librados through Debian's python3-rados/python3-rbd):
what it is configured with, connecting lazily, reconnecting once when the connection was shut
down (a blocklisted client, a restarted cluster), and mon commands.

The cephx key stays in memory: it is handed to librados as the `key` option, never written to a
file, never part of a repr, a log line or an exception.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from persys.storage.base import StorageError, StorageUnavailable

T = TypeVar("T")
# Ceph keeps no "forever": ceph-csi's network fence uses five years for a blocklist entry too.
FIVE_YEARS_S = 157_784_760
CONNECTION_SHUTDOWN = 108  # ESHUTDOWN: librados' EBLOCKLISTED, and a connection shut down


@dataclass(frozen=True)
class CephConfig:
    """How a node reaches the cluster. `key` is the cephx secret of `user` (without "client.")."""

    monitors: tuple[tuple[str, int], ...]
    user: str
    key: str = field(repr=False)
    pool: str = "persys-volumes"
    secret_name: str = ""  # where the key lives in the secret store: what libvirt's disk names
    conf_path: str = ""  # an optional ceph.conf on the node (also handed to QEMU)
    options: tuple[tuple[str, str], ...] = ()  # further librados options (no secrets)
    timeout_s: int = 30  # every mon and OSD operation, and the connection, is bounded by it
    blocklist_expire_s: int = FIVE_YEARS_S

    def problems(self) -> list[str]:
        """Each problem names its field; the key's value never appears."""
        out = []
        if not self.monitors:
            out.append("monitors: at least one host:port is needed")
        for host, port in self.monitors:
            if not host or not 0 < port < 65536:
                out.append(f"monitors: {host!r}:{port!r} is not a host:port")
        if not self.user or self.user.startswith("client.") or any(c.isspace() for c in self.user):
            out.append("user: a cephx user name without the 'client.' prefix")
        if not self.key or any(c.isspace() for c in self.key):
            out.append("key: the user's cephx key is missing or malformed")
        if not self.pool or "/" in self.pool:
            out.append(f"pool: {self.pool!r} is not a pool name")
        if self.timeout_s < 1:
            out.append("timeout_s: at least 1")
        for name, _ in self.options:
            if name.replace("-", "_").replace(" ", "_") in {"key", "keyfile", "keyring"}:
                out.append(f"options: {name} is given through `key`, never as an option")
        return out

    @property
    def mon_host(self) -> str:
        return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.monitors)


def ceph_modules() -> tuple[ModuleType, ModuleType]:
    """Debian's rados and rbd modules, or StorageUnavailable saying how to get them."""
    try:
        import rados
        import rbd
    except ImportError as err:
        raise StorageUnavailable(
            f"librados/librbd Python bindings are not importable ({err}): install python3-rados and "
            "python3-rbd, then scripts/install.sh links them into the .venv") from err
    return rados, rbd


class CephSession:
    """A cluster connection and an I/O context on the volumes pool, made on first use. Calls run in
    the caller's thread; librados handles are thread-safe, only (re)connecting takes the lock."""

    def __init__(self, config: CephConfig) -> None:
        bad = config.problems()
        if bad:
            raise StorageError("ceph-rbd configuration: " + "; ".join(bad))
        self.config = config
        self.rados, self.rbd = ceph_modules()
        self._lock = threading.Lock()
        self._cluster: Any = None
        self._ioctx: Any = None

    def _connect(self) -> tuple[Any, Any]:
        c = self.config
        t = str(c.timeout_s)
        opts = {
            "mon_host": c.mon_host, "key": c.key, "client_mount_timeout": t,
            "rados_mon_op_timeout": t, "rados_osd_op_timeout": t,
            # Fencing blocklists by itself (a chosen expiry, the watchers too); a lock broken on
            # detach is this node's own from an earlier connection, which needs no blocklisting.
            "rbd_blocklist_on_break_lock": "false",
            **dict(c.options),
        }
        conffile = c.conf_path or self.rados.Rados.NO_CONF_FILE
        cluster = None
        try:
            cluster = self.rados.Rados(rados_id=c.user, conffile=conffile, conf=opts)
            cluster.connect(timeout=c.timeout_s)
            ioctx = cluster.open_ioctx(c.pool)
        except self.rados.ObjectNotFound as err:
            _shutdown(cluster)
            raise StorageUnavailable(f"pool {c.pool!r} does not exist in the Ceph cluster") from err
        except self.rados.PermissionDeniedError as err:
            _shutdown(cluster)
            raise StorageUnavailable(f"cephx user client.{c.user} was refused by the monitors at "
                                     f"{c.mon_host} (wrong key or caps)") from err
        except (self.rados.Error, OSError) as err:
            _shutdown(cluster)
            raise StorageUnavailable(f"Ceph monitors at {c.mon_host} unreachable as client.{c.user}: "
                                     f"{type(err).__name__}") from err
        return cluster, ioctx

    def ioctx(self) -> Any:
        with self._lock:
            if self._ioctx is None:
                self._cluster, self._ioctx = self._connect()
            return self._ioctx

    def _reset(self, stale: Any) -> None:
        with self._lock:
            if self._ioctx is stale:
                cluster, self._cluster, self._ioctx = self._cluster, None, None
                stale.close()
                _shutdown(cluster)

    def run(self, fn: Callable[[Any], T]) -> T:
        """fn(ioctx), once more on a fresh connection if this one was shut down (blocklisted after
        a fence, or the cluster restarted): every driver call is idempotent, so a retry is safe."""
        for attempt in (1, 2):
            ioctx = self.ioctx()
            try:
                return fn(ioctx)
            except (self.rbd.ConnectionShutdown, self.rados.ConnectionShutdown) as err:
                self._reset(ioctx)
                if attempt == 2:
                    raise StorageUnavailable(f"Ceph connection shut down twice: {err}") from err
            except (self.rbd.Timeout, self.rados.TimedOut) as err:
                self._reset(ioctx)
                raise StorageUnavailable(f"Ceph did not answer within {self.config.timeout_s} s") from err
        raise AssertionError("unreachable")

    def addresses(self) -> list[str]:
        """This connection's client addresses (as lockers and watchers show them)."""
        self.ioctx()
        addrs = str(self._cluster.get_addrs())
        return [a.strip() for a in addrs.strip("[]").split(",") if a.strip()]

    def instance(self) -> str:
        self.ioctx()
        return f"client.{self._cluster.get_instance_id()}"

    def mon_command(self, cmd: dict[str, Any]) -> str:
        def call(_: Any) -> str:
            ret, out, err = self._cluster.mon_command(json.dumps(cmd), b"", timeout=self.config.timeout_s)
            if ret == -CONNECTION_SHUTDOWN:
                raise self.rados.ConnectionShutdown(err)
            if ret != 0:
                raise StorageError(f"Ceph refused `{cmd.get('prefix')}` ({ret}): {err}")
            return str(err or out)
        return self.run(call)

    def close(self) -> None:
        with self._lock:
            cluster, ioctx, self._cluster, self._ioctx = self._cluster, None, None, None
        if ioctx is not None:
            ioctx.close()
        _shutdown(cluster)


def _shutdown(cluster: Any) -> None:
    if cluster is not None:
        cluster.shutdown()
