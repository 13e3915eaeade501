"""StateStore on etcd v3 over gRPC (grpc.aio), using our own minimal protos in proto/etcd/.

Notes on etcd semantics we rely on:
* Lease TTLs are whole seconds: grant_lease() rounds up with math.ceil, and etcd itself raises
  any TTL below its minimum (ceil(1.5 * election timeout), 2 s with default flags).
* Lease expiry is detected by etcd's lessor loop (every ~500 ms), so keys go a bit after the TTL.
* History is kept until someone compacts (etcdctl compact / --auto-compaction-*); watching from
  a compacted revision raises WatchCompacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import grpc
import grpc.aio

from persys._pb.etcd.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from persys._pb.etcd.mvccpb import kv_pb2
from persys.backend_access import BackendTLS, tls_refusal_hint
from persys.credentials import Login
from persys.store.base import (
    DEFAULT_MAX_TXN_BYTES,
    CompactedError,
    Compare,
    Delete,
    FutureRevision,
    KeyValue,
    LeaseNotFound,
    Put,
    StoreError,
    StoreFull,
    StoreUnavailable,
    TLSFiles,
    WatchEvent,
    check_txn_size,
    prefix_range_end,
)
from persys.store.etcd_auth import (
    Metadata,
    StoreAccessDenied,
    TokenKeeper,
    is_stale_token,
    stale_token_text,
)
from persys.store.etcd_lease import BlockingLease
from persys.store.etcd_wire import (
    CHANNEL_OPTIONS,
    channel_credentials,
    key_value,
    raise_if_ended,
    store_error,
    target_of,
    too_large,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_RANGE_PAGE = 1000
_RANGE_PAGE_BYTES = 4 << 20

_MAX_RECEIVE_BYTES = 64 << 20
# The key a count-only read asks for when only the revision is wanted: inside the prefix a
# Persys etcd role may read (a read of "\0", outside it, is refused to a prefix-limited user).
REVISION_PROBE_KEY = b"/persys/"


_WRITES = (rpc_pb2.TxnRequest, rpc_pb2.PutRequest, rpc_pb2.DeleteRangeRequest)


@dataclass
class _WatchState:
    """One watch across its reconnections: where to resume, the backoff, what was said."""

    next_rev: int | None  # None: "from now", pinned at the first stream's creation
    backoff: float = 0.1
    outage_logged: bool = False
    renewed: bool = False  # a watch refused for a stale token gets one new authentication


class EtcdStore:
    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tls: TLSFiles | BackendTLS | None = None,
        login: Login | None = None,
        timeout: float = 5.0,
        max_txn_bytes: int = DEFAULT_MAX_TXN_BYTES,
        max_receive_bytes: int = _MAX_RECEIVE_BYTES,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is required")
        self.endpoints = list(endpoints)
        self.target = target_of(self.endpoints)
        self.timeout = timeout
        # Match etcd's --max-request-bytes: a larger write is refused here with TxnTooLarge
        # rather than by etcd with an error that looks like any other failure.
        self.max_txn_bytes = max_txn_bytes
        options = [*CHANNEL_OPTIONS, ("grpc.max_receive_message_length", max_receive_bytes)]
        self._creds: grpc.ChannelCredentials | None = None
        if tls is not None:
            self._creds = channel_credentials(tls)
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            self._channel = grpc.aio.secure_channel(self.target, self._creds, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=options)
        self._options = options
        # etcd authentication: a token in every call's metadata (None: etcd has auth off, or
        # takes the user from our client certificate's common name).
        self._auth = TokenKeeper(login, self.target, timeout) if login is not None else None
        self._kv = rpc_pb2_grpc.KVStub(self._channel)
        self._watch = rpc_pb2_grpc.WatchStub(self._channel)
        self._lease = rpc_pb2_grpc.LeaseStub(self._channel)
        self._maint = rpc_pb2_grpc.MaintenanceStub(self._channel)
        # One shared LeaseKeepAlive stream; the lock pairs each request with its response.
        self._ka_call: grpc.aio.StreamStreamCall | None = None
        self._ka_metadata: Metadata | None = None
        self._ka_lock = asyncio.Lock()
        self._closed = False
        self.full = ""  # why writes are refused for want of space (etcd NOSPACE alarm); "" while they are not

    @property
    def user(self) -> str | None:
        return self._auth.user if self._auth is not None else None

    @property
    def authentications(self) -> int:
        """How many tokens this store obtained (one at first, one per expiry seen)."""
        return self._auth.authentications if self._auth is not None else 0

    async def _metadata(self) -> Metadata | None:
        return await self._auth.metadata(self._channel) if self._auth is not None else None

    async def _fresh_token(self, stale: Metadata | None) -> None:
        """Authenticate again: etcd said the token in `stale` is no longer valid."""
        if self._auth is not None:
            await self._auth.refresh(self._channel, stale[0][1] if stale else None)

    async def _call(self, fn: Callable[..., Awaitable[T]], request: object) -> T:
        if self._closed:
            raise StoreUnavailable("etcd store is closed")
        for attempt in range(2):  # an expired token gets one new authentication
            metadata = await self._metadata()
            try:
                answer = await fn(request, timeout=self.timeout, metadata=metadata)
            except grpc.aio.AioRpcError as e:
                if attempt == 0 and self._auth is not None and is_stale_token(e):
                    await self._fresh_token(metadata)
                    continue
                err = store_error(e, self.target, self.user)
                if isinstance(err, StoreFull):
                    self.full = str(err)
                raise err from e
            if self.full and isinstance(request, _WRITES):
                self.full = ""  # a write went through: the alarm is disarmed
            return answer
        raise AssertionError("unreachable")

    async def check_access(self, attempts: int = 3) -> None:
        """Raise StoreAccessDenied for a wrong password, TLS identity or role; return on an outage.
        A TLS 1.3 server refusing our certificate may reset the connection instead of sending its
        alert, so an unexplained failure is tried again before it counts as an outage."""
        for attempt in range(attempts):
            try:
                await self.current_revision()
                return
            except StoreUnavailable as e:
                hint = tls_refusal_hint(str(e), "etcd")
                if hint:
                    raise StoreAccessDenied(f"etcd at {self.target}: {hint} ({e})") from None
                if attempt + 1 == attempts or "DEADLINE_EXCEEDED" in str(e):
                    return  # an outage (a timeout is not worth waiting for twice)
                await asyncio.sleep(0.1)

    # ---- KV ---------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        resp = await self._call(self._kv.Range, rpc_pb2.RangeRequest(key=key.encode()))
        return key_value(resp.kvs[0]) if resp.kvs else None

    async def range(self, prefix: str) -> tuple[list[KeyValue], int]:
        out: list[KeyValue] = []
        revision = 0
        async for kvs, rev in self.range_pages(prefix, _RANGE_PAGE):
            out += kvs
            revision = rev
        return out, revision

    async def range_at(self, prefix: str, revision: int) -> list[KeyValue]:
        """etcd's MVCC read at a past revision (kept until someone compacts)."""
        if revision <= 0:
            raise FutureRevision(f"revision {revision} does not exist (revisions start at 1)")
        out: list[KeyValue] = []
        try:
            async for kvs, _ in self.range_pages(prefix, _RANGE_PAGE, revision):
                out += kvs
        except CompactedError as err:
            raise CompactedError(f"revision {revision} has been compacted in etcd ({err})") from None
        except StoreError as err:
            if "future revision" in str(err):
                raise FutureRevision(f"revision {revision} is in the future ({err})") from None
            raise
        return out

    async def range_pages(self, prefix: str, page: int = _RANGE_PAGE, revision: int = 0
                          ) -> AsyncIterator[tuple[list[KeyValue], int]]:
        start = prefix.encode() or b"\0"
        end = prefix_range_end(prefix.encode())
        # Pages after the first read at the first page's revision (or the one asked for): one snapshot.
        while True:
            try:
                resp = await self._call(
                    self._kv.Range,
                    rpc_pb2.RangeRequest(key=start, range_end=end, limit=page, revision=revision),
                )
            except StoreError as err:
                # Pages are counted in keys, and large values can make one larger than a message
                # may be: ask for fewer keys at a time (one key always fits: values are bounded).
                if page > 1 and too_large(err):
                    page //= 2
                    continue
                raise
            revision = revision or resp.header.revision
            size = resp.ByteSize()
            yield [key_value(kv) for kv in resp.kvs], revision
            if not resp.more or not resp.kvs:
                return
            start = resp.kvs[-1].key + b"\0"
            if size > _RANGE_PAGE_BYTES:  # large values: fewer keys a page, so a page stays a few MiB
                page = max(1, page * _RANGE_PAGE_BYTES // size)

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        check_txn_size((), (Put(key, value),), self.max_txn_bytes)
        resp = await self._call(self._kv.Put, rpc_pb2.PutRequest(key=key.encode(), value=value, lease=lease))
        return int(resp.header.revision)

    async def cas(self, key: str, value: bytes, expected_mod_revision: int, lease: int = 0) -> int | None:
        return await self.txn([Compare(key, expected_mod_revision)], [Put(key, value, lease)])

    async def delete(self, key: str, expected_mod_revision: int | None = None) -> bool:
        if expected_mod_revision is None:
            resp = await self._call(self._kv.DeleteRange, rpc_pb2.DeleteRangeRequest(key=key.encode()))
            return int(resp.deleted) > 0
        tresp = await self._txn([Compare(key, expected_mod_revision)], [Delete(key)])
        return bool(tresp.succeeded) and int(tresp.responses[0].response_delete_range.deleted) > 0

    async def _txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> rpc_pb2.TxnResponse:
        check_txn_size(compares, ops, self.max_txn_bytes)
        req = rpc_pb2.TxnRequest(
            compare=[
                rpc_pb2.Compare(
                    result=rpc_pb2.Compare.EQUAL,
                    target=rpc_pb2.Compare.MOD,
                    key=c.key.encode(),
                    mod_revision=c.mod_revision,  # a missing key compares as mod_revision 0
                )
                for c in compares
            ],
            success=[
                rpc_pb2.RequestOp(
                    request_put=rpc_pb2.PutRequest(key=op.key.encode(), value=op.value, lease=op.lease)
                )
                if isinstance(op, Put)
                else rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=op.key.encode()))
                for op in ops
            ],
        )
        return await self._call(self._kv.Txn, req)

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> int | None:
        resp = await self._txn(compares, ops)
        return int(resp.header.revision) if resp.succeeded else None

    async def current_revision(self) -> int:
        # count_only on a single key: the cheapest linearizable read that returns a header.
        resp = await self._call(self._kv.Range, rpc_pb2.RangeRequest(key=REVISION_PROBE_KEY, count_only=True))
        return int(resp.header.revision)

    # ---- leases -----------------------------------------------------------------------

    async def grant_lease(self, ttl: float) -> int:
        if ttl <= 0:
            raise ValueError("lease ttl must be > 0")
        resp = await self._call(self._lease.LeaseGrant, rpc_pb2.LeaseGrantRequest(TTL=max(1, math.ceil(ttl))))
        if resp.error:
            raise StoreError(f"etcd lease grant failed: {resp.error}")
        return int(resp.ID)

    async def revoke_lease(self, lease_id: int) -> None:
        await self._call(self._lease.LeaseRevoke, rpc_pb2.LeaseRevokeRequest(ID=lease_id))

    async def keep_alive(self, lease_id: int) -> float:
        if self._closed:
            raise StoreUnavailable("etcd store is closed")
        async with self._ka_lock:
            for attempt in range(2):  # a stale stream (e.g. after an etcd restart) gets one retry
                resp = await self._keep_alive_once(lease_id, may_retry=attempt == 0)
                if resp is None:
                    continue
                if resp.TTL <= 0:
                    raise LeaseNotFound(f"lease {lease_id:x} not found")
                return float(resp.TTL)
        raise AssertionError("unreachable")

    async def _keep_alive_once(self, lease_id: int, may_retry: bool) -> rpc_pb2.LeaseKeepAliveResponse | None:
        """One keep-alive on the shared stream (opened if needed); None when the stream was
        stale and `may_retry` (it is dropped, a stale token renewed, for a second try)."""
        if self._ka_call is None:
            self._ka_metadata = await self._metadata()
            self._ka_call = self._lease.LeaseKeepAlive(metadata=self._ka_metadata)
        call = self._ka_call
        try:
            async with asyncio.timeout(self.timeout):
                await call.write(rpc_pb2.LeaseKeepAliveRequest(ID=lease_id))
                resp = await call.read()
        except (grpc.aio.AioRpcError, TimeoutError, asyncio.InvalidStateError) as e:
            call.cancel()
            self._ka_call = None
            if may_retry and not isinstance(e, TimeoutError):
                if isinstance(e, grpc.aio.AioRpcError) and is_stale_token(e):
                    await self._fresh_token(self._ka_metadata)
                return None
            if isinstance(e, grpc.aio.AioRpcError):
                raise store_error(e, self.target, self.user) from e
            raise StoreUnavailable(f"etcd at {self.target}: lease keep-alive failed: {e!r}") from e
        if resp is grpc.aio.EOF:
            self._ka_call = None
            if may_retry:
                return None
            raise StoreUnavailable(f"etcd at {self.target}: keep-alive stream closed")
        assert isinstance(resp, rpc_pb2.LeaseKeepAliveResponse)
        return resp

    def blocking_lease(self) -> BlockingLease:
        """A lease keep-alive for a plain thread, on a connection of its own (see BlockingLease)."""
        return BlockingLease(self.target, self._creds, self._options, self.timeout, self._auth)

    # ---- watch ------------------------------------------------------------------------

    async def watch(self, prefix: str, start_revision: int | None = None) -> AsyncIterator[WatchEvent]:
        key = prefix.encode() or b"\0"
        end = prefix_range_end(prefix.encode())
        st = _WatchState(start_revision if start_revision and start_revision > 0 else None)
        while not self._closed:
            metadata = await self._metadata()
            call = self._watch.Watch(metadata=metadata)
            try:
                await call.write(
                    rpc_pb2.WatchRequest(
                        create_request=rpc_pb2.WatchCreateRequest(
                            key=key, range_end=end, start_revision=st.next_rev or 0, progress_notify=True
                        )
                    )
                )
                async for ev in self._watch_stream(call, metadata, st):
                    yield ev
            except grpc.aio.AioRpcError as e:
                if self._closed or e.code() == grpc.StatusCode.CANCELLED:
                    return
                err = store_error(e, self.target, self.user)
                if not isinstance(err, StoreUnavailable):
                    raise err from e
                if not st.outage_logged:
                    log.warning("etcd watch on %r interrupted, reconnecting: %s", prefix, err)
                    st.outage_logged = True
            finally:
                call.cancel()
            await asyncio.sleep(st.backoff)
            st.backoff = min(st.backoff * 2, 2.0)

    async def _watch_stream(self, call: Any, metadata: Metadata | None, st: _WatchState) -> AsyncIterator[WatchEvent]:
        """The events of one watch stream until it ends (EOF, or a stale token renewed for the
        next stream); `st.next_rev` follows them, so the next stream resumes after the last."""
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                return
            assert isinstance(resp, rpc_pb2.WatchResponse)
            if self._token_refused(resp, st.renewed):
                # etcd cancels a watch created with an expired token ("invalid auth token").
                st.renewed = True
                await self._fresh_token(metadata)
                return
            raise_if_ended(resp, st.next_rev, self.target, self.user)
            if resp.created:
                st.backoff, st.outage_logged, st.renewed = 0.1, False, False
                if st.next_rev is None:  # "from now": pin it so a reconnect misses nothing
                    st.next_rev = resp.header.revision + 1
                continue
            for ev in resp.events:
                kind: Literal["put", "delete"] = "put" if ev.type == kv_pb2.Event.PUT else "delete"
                rev = ev.kv.mod_revision
                st.next_rev = rev + 1
                yield WatchEvent(kind, key_value(ev.kv), rev)

    def _token_refused(self, resp: rpc_pb2.WatchResponse, renewed: bool) -> bool:
        return self._auth is not None and not renewed and resp.canceled and stale_token_text(resp.cancel_reason)

    # ---- misc -------------------------------------------------------------------------

    async def status(self) -> dict[str, object]:
        resp = await self._call(self._maint.Status, rpc_pb2.StatusRequest())
        return {
            "backend": "etcd",
            "endpoint": self.target,
            "revision": int(resp.header.revision),
            "version": resp.version,
            "leader": int(resp.leader),
            "member_id": int(resp.header.member_id),
            "db_size": int(resp.dbSize),
            # The NOSPACE alarm, as the last write met it (every write is refused meanwhile).
            **({"full": self.full} if self.full else {}),
        }

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._ka_call is not None:
            self._ka_call.cancel()
            self._ka_call = None
        with contextlib.suppress(Exception):
            await self._channel.close()
