"""How the etcd store speaks to etcd: the channel's credentials, options and target (one
endpoint or several), key-values read off the wire, gRPC errors as the store's errors, and
the watch responses that end a watch."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path

import grpc
import grpc.aio

from persys._pb.etcd.etcdserverpb import rpc_pb2
from persys._pb.etcd.mvccpb import kv_pb2
from persys.backend_access import BackendTLS
from persys.store.base import (
    CompactedError,
    KeyValue,
    LeaseNotFound,
    StoreError,
    StoreFull,
    StoreUnavailable,
    TLSFiles,
    WatchCompacted,
)
from persys.store.etcd_auth import (
    denied,
    is_permission_denied,
)

UNAVAILABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    # Reconnect quickly after an etcd restart (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # Detect dead connections under long-lived watch streams (etcd's minimum is 5 s).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]


def channel_credentials(tls: TLSFiles | BackendTLS) -> grpc.ChannelCredentials:
    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    return grpc.ssl_channel_credentials(root_certificates=read(tls.ca), private_key=read(tls.key),
                                        certificate_chain=read(tls.cert))


def target_of(endpoints: Sequence[str]) -> str:
    """gRPC target for one or several host:port endpoints.

    Several endpoints become an `ipv4:`/`ipv6:` address list (pick_first fails over in order);
    that resolver only accepts IP literals."""
    if len(endpoints) == 1:
        return endpoints[0]
    hosts = [ep.rsplit(":", 1)[0].strip("[]") for ep in endpoints]
    try:
        versions = {ipaddress.ip_address(h).version for h in hosts}
    except ValueError as e:
        raise ValueError(f"multiple etcd endpoints must be IP literals: {endpoints}") from e
    if len(versions) != 1:
        raise ValueError(f"cannot mix IPv4 and IPv6 etcd endpoints: {endpoints}")
    return f"ipv{versions.pop()}:" + ",".join(endpoints)


def key_value(kv: kv_pb2.KeyValue) -> KeyValue:
    return KeyValue(kv.key.decode(), kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


def too_large(err: StoreError) -> bool:
    cause = err.__cause__
    return isinstance(cause, grpc.aio.AioRpcError) and cause.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def store_error(e: grpc.aio.AioRpcError, target: str, user: str | None = None) -> StoreError:
    code, details = e.code(), e.details() or ""
    if is_permission_denied(details):
        return denied(target, user, details)
    if code in UNAVAILABLE_CODES:
        return StoreUnavailable(f"etcd at {target} unavailable ({code.name}): {details}")
    if "database space exceeded" in details:  # etcd's NOSPACE alarm: reads work, writes do not
        return StoreFull(f"etcd at {target} refuses writes: {details} (compact, defragment and disarm "
                         "the alarm: etcdctl alarm disarm)")
    if "lease not found" in details:
        return LeaseNotFound(details)
    if "compacted" in details:
        return CompactedError(details)
    return StoreError(f"etcd error ({code.name}): {details}")


def raise_if_ended(resp: rpc_pb2.WatchResponse, next_rev: int | None, target: str, user: str | None) -> None:
    """A watch response that ends the watch: compacted history or a cancellation by etcd."""
    if resp.compact_revision:
        # etcd's compact_revision is the oldest revision still watchable.
        raise WatchCompacted(next_rev or 0, int(resp.compact_revision))
    if resp.canceled and is_permission_denied(resp.cancel_reason):
        raise denied(target, user, resp.cancel_reason)
    if resp.canceled:
        raise StoreError(f"etcd canceled the watch: {resp.cancel_reason}")
