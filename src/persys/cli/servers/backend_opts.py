"""`persys scheduler`'s options for etcd and Redis as they run in production (own CA, client
certificates, users), turned into the BackendAccess the scheduler opens them with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import typer

from persys.backend_access import BackendAccess, BackendOptions, backend_access
from persys.cli.servers.errors import ServerError
from persys.credentials import CredentialError
from persys.scheduler.replica.backends import BackendRefused
from persys.tlsfiles import TLSFiles

REF = "file:PATH, env:NAME or secret:NAME/KEY"

SCHEDULER_HELP = """Run a scheduler replica.

In production etcd and Redis usually have their own CA and users: --etcd-ca, --etcd-cert and
--etcd-key, --etcd-user with --etcd-password-file (or --etcd-password file:PATH, env:NAME or
secret:NAME/KEY); likewise --redis-*. A password is never accepted on the command line or in
a URL. Example:

persys scheduler --tls-dir /etc/persys/pki \\
  --store etcds://10.0.0.2:2379 --etcd-ca /etc/etcd/ca.crt \\
  --etcd-cert /etc/persys/etcd.crt --etcd-key /etc/persys/etcd.key \\
  --etcd-user persys --etcd-password-file /etc/persys/etcd-password \\
  --events rediss://persys@10.0.0.3:6380/0 --redis-ca /etc/redis/ca.crt \\
  --redis-password env:PERSYS_REDIS_PASSWORD

Users, roles and ACLs to create: docs/security.md, "etcd and Redis in production".
"""

# The options, shared by name with the scheduler command's signature (typer reads them there).
ETCD_CA = typer.Option(None, "--etcd-ca", help="CA certificate that issued etcd's server certificate, when etcd "
                       "has a PKI of its own (needs etcds://; default: the CA in --tls-dir).")
ETCD_CERT = typer.Option(None, "--etcd-cert", help="Client certificate for etcd's --client-cert-auth, issued by "
                         "etcd's CA (with --etcd-key; default with etcds:// and no --etcd-ca: scheduler.crt).")
ETCD_KEY = typer.Option(None, "--etcd-key", help="Private key of --etcd-cert.")
ETCD_SERVER_NAME = typer.Option(None, "--etcd-server-name", help="Name to verify in etcd's certificate when "
                                "the endpoints are IP addresses it does not list.")
ETCD_USER = typer.Option(None, "--etcd-user", help="etcd user (etcd authentication on); its role needs "
                         "readwrite on the prefix /persys only (docs/security.md).")
ETCD_PASSWORD = typer.Option(None, "--etcd-password", help=f"Where --etcd-user's password is: {REF}. Never the "
                             "password itself: command lines are visible to every local user.")
ETCD_PASSWORD_FILE = typer.Option(None, "--etcd-password-file", help="File holding --etcd-user's password "
                                  "(same as --etcd-password file:PATH).")
REDIS_CA = typer.Option(None, "--redis-ca", help="CA certificate that issued Redis' certificate (needs "
                        "rediss://; default: the system's trusted CAs).")
REDIS_CERT = typer.Option(None, "--redis-cert", help="Client certificate for Redis' tls-auth-clients (with "
                          "--redis-key).")
REDIS_KEY = typer.Option(None, "--redis-key", help="Private key of --redis-cert.")
REDIS_USER = typer.Option(None, "--redis-user", help="Redis ACL user (or rediss://USER@host:port/0); see "
                          "docs/security.md for its ACL SETUSER line.")
REDIS_PASSWORD = typer.Option(None, "--redis-password", help=f"Where the Redis user's password is: {REF}.")
REDIS_PASSWORD_FILE = typer.Option(None, "--redis-password-file", help="File holding the Redis user's password.")


def _configured(access: BackendAccess) -> BackendAccess | None:
    return access if access.tls is not None or access.password is not None else None


def store_access(url: str, persys_tls: TLSFiles, ca: Path | None, cert: Path | None, key: Path | None,
                 server_name: str | None, user: str | None, password: str | None,
                 password_file: Path | None) -> BackendAccess | None:
    """How to reach etcd (None: a plain etcd:// or SQLite URL with no options). Raises CredentialError."""
    options = BackendOptions("etcd", url, ca, cert, key, server_name, user, password, password_file)
    if url.partition("://")[0] not in ("etcd", "etcds"):
        backend_access(options)  # refuses etcd options given with another store
        return None
    return _configured(backend_access(options, default_tls=persys_tls))


def events_access(url: str, ca: Path | None, cert: Path | None, key: Path | None, user: str | None,
                  password: str | None, password_file: Path | None) -> BackendAccess | None:
    """How to reach Redis (None: nothing beyond the URL). Raises CredentialError."""
    options = BackendOptions("redis", url, ca, cert, key, None, user, password, password_file)
    access = backend_access(options)
    return _configured(access) if url.partition("://")[0] in ("redis", "rediss", "unix") else None


EtcdValues = tuple[Path | None, Path | None, Path | None, str | None, str | None, str | None, Path | None]
RedisValues = tuple[Path | None, Path | None, Path | None, str | None, str | None, Path | None]


def accesses(store: str, events: str, persys_tls: TLSFiles, etcd: EtcdValues, redis: RedisValues
             ) -> tuple[BackendAccess | None, BackendAccess | None]:
    """Both backends' access from the option values (in declaration order); ServerError if wrong."""
    with refusals():
        return store_access(store, persys_tls, *etcd), events_access(events, *redis)


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """A backend refusing our credentials, or options and references that are wrong: ServerError
    (one line on stderr, no traceback)."""
    try:
        yield
    except (BackendRefused, CredentialError) as e:
        raise ServerError(str(e)) from None


__all__ = ["SCHEDULER_HELP", "accesses", "events_access", "refusals", "store_access"]
