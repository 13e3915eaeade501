"""A node's storage configuration, as `persys agent --storage FILE` and a node of the
`persys dev --nodes` file give it (pure: parsing and checks only; errors name the field).

    local:    {pool: /var/lib/persys/volumes}
    nfs:      {server: nfs.example, port: 2049, export: /export, mountRoot: /var/lib/persys/nfs}
    ceph-rbd: {monitors: ["10.0.0.1:3300"], pool: rbd, user: persys, secretName: ceph-persys,
               conf: /etc/ceph/ceph.conf, keyFile: /etc/persys/ceph-persys.key}
    simulate: {ceph-rbd: [vm-disk]}   # persys dev only: advertise without probing (no hardware)
    rgw:      {endpoint: http://rgw.example:7480, accessKey: persys-admin,
               secretKeyFile: /etc/persys/rgw-admin.key}   # the scheduler's buckets (Ceph RGW)

A driver without its section is not configured on the node (and is reported so). The cephx key
itself never appears here: `secretName` names it in the secret store (the scheduler hands it to
the node), or `keyFile` a root-only file holding it; nor does RGW's admin secret key:
`secretKeyFile` names a root-only file (storage.rgw_access reads it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from persys.model.documents import DocumentError, load_yaml
from persys.storage.base import VOLUME_ID_RE, AttachKind

DRIVERS = ("local", "nfs", "ceph-rbd")
DEFAULT_NFS_MOUNTS = "/var/lib/persys/storage/nfs-mounts"
_HOST_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9.]{0,252})$|^\[[0-9A-Fa-f:.]+\]$")
_USER_RE = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,63}$")
_ENDPOINT_RE = re.compile(r"^https?://([A-Za-z0-9][-A-Za-z0-9.]{0,252}|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?/?$")
_ACCESS_KEY_RE = re.compile(r"^[A-Za-z0-9_+=,.@-]{1,128}$")


class StorageConfigError(ValueError):
    def __init__(self, field_path: str, problem: str) -> None:
        self.field = field_path
        super().__init__(f"{field_path}: {problem}")


@dataclass(frozen=True, slots=True)
class LocalConfig:
    pool: str


@dataclass(frozen=True, slots=True)
class NfsConfig:
    server: str
    export: str
    port: int = 2049
    mount_root: str = DEFAULT_NFS_MOUNTS


@dataclass(frozen=True, slots=True)
class CephConfig:
    monitors: tuple[tuple[str, int], ...]
    pool: str
    user: str
    secret_name: str
    conf: str = ""
    # A file on the node holding the user's cephx key (root-only: 0600 or 0400), read at start and
    # kept in memory; the key itself is never in this configuration.
    key_file: str = ""


@dataclass(frozen=True, slots=True)
class RgwConfig:
    endpoint: str  # http(s)://host[:port], RGW's S3 and admin API
    access_key: str  # the RGW admin user's access key id (not a secret)
    secret_key_file: str  # its secret key, in a file only its owner reads (0600 or 0400)


@dataclass(frozen=True, slots=True)
class StorageConfig:
    local: LocalConfig | None = None
    nfs: NfsConfig | None = None
    ceph: CephConfig | None = None
    simulate: Mapping[str, frozenset[AttachKind]] = field(default_factory=dict)
    rgw: RgwConfig | None = None

    def configured(self) -> list[str]:
        return [name for name, sec in zip(DRIVERS, (self.local, self.nfs, self.ceph), strict=True) if sec]


def _mapping(raw: Any, where: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise StorageConfigError(where, "must be a mapping")
    for key in raw:
        if key not in known:
            raise StorageConfigError(f"{where}.{key}", f"unknown field (known: {', '.join(known)})")
    return raw


def _text(raw: dict[str, Any], key: str, where: str, *, required: bool = True, default: str = "") -> str:
    value = raw.get(key, None)
    if value is None:
        if required:
            raise StorageConfigError(f"{where}.{key}", "required")
        return default
    if not isinstance(value, str) or not value.strip():
        raise StorageConfigError(f"{where}.{key}", "must be a non-empty string")
    return value


def _abs_path(raw: dict[str, Any], key: str, where: str, *, default: str | None = None) -> str:
    value = _text(raw, key, where, required=default is None, default=default or "")
    if not value.startswith("/") or "\x00" in value or ".." in value.split("/"):
        raise StorageConfigError(f"{where}.{key}", f"{value!r} is not an absolute path")
    return value


def _port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise StorageConfigError(where, f"{value!r} is not a port (an integer in 1..65535)")
    return value


def _host(value: str, where: str) -> str:
    if not _HOST_RE.fullmatch(value):
        raise StorageConfigError(where, f"{value!r} is not a host name or address")
    return value


def _local(raw: Any) -> LocalConfig:
    sec = _mapping(raw, "storage.local", ("pool",))
    return LocalConfig(_abs_path(sec, "pool", "storage.local"))


def _nfs(raw: Any) -> NfsConfig:
    where = "storage.nfs"
    sec = _mapping(raw, where, ("server", "port", "export", "mountRoot"))
    server = _host(_text(sec, "server", where), f"{where}.server")
    return NfsConfig(server, _abs_path(sec, "export", where), _port(sec.get("port", 2049), f"{where}.port"),
                     _abs_path(sec, "mountRoot", where, default=DEFAULT_NFS_MOUNTS))


def _monitor(value: Any, where: str) -> tuple[str, int]:
    if not isinstance(value, str) or ":" not in value:
        raise StorageConfigError(where, f"{value!r} is not host:port")
    host, _, port = value.rpartition(":")
    if not port.isdigit():
        raise StorageConfigError(where, f"{value!r} is not host:port")
    return _host(host, where), _port(int(port), where)


def _ceph(raw: Any) -> CephConfig:
    where = "storage.ceph-rbd"
    sec = _mapping(raw, where, ("monitors", "pool", "user", "secretName", "conf", "keyFile"))
    mons = sec.get("monitors")
    if not isinstance(mons, list) or not mons:
        raise StorageConfigError(f"{where}.monitors", "required: a list of host:port")
    monitors = tuple(_monitor(m, f"{where}.monitors[{i}]") for i, m in enumerate(mons))
    pool = _text(sec, "pool", where)
    if not _USER_RE.fullmatch(pool):
        raise StorageConfigError(f"{where}.pool", f"{pool!r} is not a Ceph pool name")
    user = _text(sec, "user", where)
    if not _USER_RE.fullmatch(user) or user.startswith("client."):
        raise StorageConfigError(f"{where}.user", f"{user!r} is not a cephx user (without 'client.')")
    secret = _text(sec, "secretName", where)
    if not VOLUME_ID_RE.fullmatch(secret):
        raise StorageConfigError(f"{where}.secretName", f"{secret!r} is not a secret name")
    conf = _abs_path(sec, "conf", where) if "conf" in sec else ""
    key_file = _abs_path(sec, "keyFile", where) if "keyFile" in sec else ""
    return CephConfig(monitors, pool, user, secret, conf, key_file)


def _simulate(raw: Any) -> dict[str, frozenset[AttachKind]]:
    sec = _mapping(raw, "storage.simulate", DRIVERS)
    out = {}
    for driver, kinds in sec.items():
        where = f"storage.simulate.{driver}"
        if not isinstance(kinds, list):
            raise StorageConfigError(where, "must be a list of attach kinds (filesystem, vm-disk)")
        try:
            out[driver] = frozenset(AttachKind(k) for k in kinds)
        except ValueError:
            raise StorageConfigError(where, f"{kinds!r}: attach kinds are filesystem and vm-disk") from None
    return out


def _rgw(raw: Any) -> RgwConfig:
    where = "storage.rgw"
    if isinstance(raw, dict) and "secretKey" in raw:  # say where the key belongs
        raise StorageConfigError(f"{where}.secretKey", "never inline: name a root-only file in secretKeyFile")
    sec = _mapping(raw, where, ("endpoint", "accessKey", "secretKeyFile"))
    endpoint = _text(sec, "endpoint", where)
    m = _ENDPOINT_RE.fullmatch(endpoint)
    if not m or (m.group(2) and not 1 <= int(m.group(2)[1:]) <= 65535):
        raise StorageConfigError(f"{where}.endpoint", f"{endpoint!r} is not an http(s)://host[:port] URL")
    access = _text(sec, "accessKey", where)
    if not _ACCESS_KEY_RE.fullmatch(access):
        raise StorageConfigError(f"{where}.accessKey", "is not an access key id (letters, digits, '_+=,.@-')")
    return RgwConfig(endpoint.rstrip("/"), access, _abs_path(sec, "secretKeyFile", where))


def parse_storage_config(raw: Any) -> StorageConfig:
    """A `StorageConfig` from a parsed document (`None` or `{}`: no driver configured)."""
    if raw is None:
        return StorageConfig()
    sec = _mapping(raw, "storage", (*DRIVERS, "simulate", "rgw"))
    return StorageConfig(
        local=_local(sec["local"]) if "local" in sec else None,
        nfs=_nfs(sec["nfs"]) if "nfs" in sec else None,
        ceph=_ceph(sec["ceph-rbd"]) if "ceph-rbd" in sec else None,
        simulate=_simulate(sec["simulate"]) if "simulate" in sec else {},
        rgw=_rgw(sec["rgw"]) if "rgw" in sec else None,
    )


def load_storage_config(text: str) -> StorageConfig:
    """From a YAML file's text (the `persys agent --storage FILE` form); aliases are refused."""
    try:
        doc = load_yaml(text)
    except DocumentError as e:
        raise StorageConfigError("storage", f"not a valid document ({e})") from None
    return parse_storage_config(doc)
