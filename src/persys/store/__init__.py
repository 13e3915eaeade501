"""Authoritative state storage: one async interface, SQLite (embedded) and etcd backends.

open_store() URLs:
  sqlite:///abs/path/state.db    sqlite://relative/path.db    sqlite://:memory:
  etcd://host:port[,host:port]   etcds://host:port[,...]  (TLS; requires tls=TLSFiles or BackendTLS)
With login=Login(user, password) the etcd store authenticates as that etcd user. A URL holding a
password is refused: credentials come from files or the environment (persys.credentials).
"""

from __future__ import annotations

from persys.backend_access import BackendTLS
from persys.credentials import Login, url_password_problem
from persys.store.base import (
    CompactedError,
    Compare,
    Delete,
    KeyValue,
    LeaseKeeper,
    LeaseNotFound,
    Put,
    StateStore,
    StoreError,
    StoreUnavailable,
    TLSFiles,
    TxnTooLarge,
    WatchCompacted,
    WatchEvent,
)

__all__ = [
    "CompactedError",
    "Compare",
    "Delete",
    "KeyValue",
    "LeaseKeeper",
    "LeaseNotFound",
    "Put",
    "StateStore",
    "StoreError",
    "StoreUnavailable",
    "TLSFiles",
    "TxnTooLarge",
    "WatchCompacted",
    "WatchEvent",
    "open_store",
]


def open_store(url: str, *, tls: TLSFiles | BackendTLS | None = None, login: Login | None = None) -> StateStore:
    problem = url_password_problem(url, "store URL", "--etcd-password")
    if problem:
        raise ValueError(problem)
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"store URL needs a scheme (sqlite://, etcd://, etcds://): {url!r}")
    if scheme == "sqlite":
        from persys.store.sqlite import SqliteStore

        # sqlite:///abs/path -> "/abs/path"; sqlite://rel/path -> "rel/path"; sqlite://:memory:
        if not rest:
            raise ValueError(f"sqlite URL needs a path: {url!r}")
        return SqliteStore(rest)
    if scheme in ("etcd", "etcds"):
        from persys.store.etcd import EtcdStore

        endpoints = [ep.strip() for ep in rest.strip("/").split(",") if ep.strip()]
        if scheme == "etcds" and tls is None:
            raise ValueError("etcds:// requires tls=TLSFiles(ca, cert, key) or BackendTLS(ca[, cert, key])")
        if scheme == "etcd" and tls is not None:
            raise ValueError("TLS files given for a plaintext etcd:// URL; use etcds://")
        return EtcdStore(endpoints, tls=tls, login=login)
    raise ValueError(f"unsupported store URL scheme {scheme!r} in {url!r}")
