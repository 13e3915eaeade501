"""A lease keep-alive for a plain thread, on a connection of its own (the etcd store's
`blocking_lease`): the scheduler's leader lease stays alive while its event loop is saturated."""

from __future__ import annotations

import grpc
import grpc.aio

from persys._pb.etcd.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from persys.store.base import (
    LeaseNotFound,
    StoreUnavailable,
)
from persys.store.etcd_auth import (
    TokenKeeper,
    is_stale_token,
)


class BlockingLease:
    """Lease keep-alives through gRPC's synchronous API, for a thread of their own.

    A keep-alive must get through while the owning process's event loop is saturated. gRPC's
    asyncio API completes every call through the first event loop that used it, whichever thread
    made the call, so a keeper on grpc.aio, even in its own thread, waits for the busy loop. The
    synchronous API blocks in its own completion queue, without the GIL, and needs no loop.
    """

    def __init__(self, target: str, creds: grpc.ChannelCredentials | None,
                 options: list[tuple[str, int | str]], timeout: float, auth: TokenKeeper | None = None) -> None:
        self.target = target
        self.timeout = timeout
        self._auth = auth
        self._channel = (grpc.secure_channel(target, creds, options=options) if creds is not None
                         else grpc.insecure_channel(target, options=options))
        self._lease = rpc_pb2_grpc.LeaseStub(self._channel)

    def keep_alive(self, lease_id: int, timeout: float | None = None) -> float:
        """Refresh the lease once; its remaining TTL. Raises LeaseNotFound or StoreUnavailable."""
        stale: str | None = None
        for attempt in range(2):  # an expired token gets one new authentication
            metadata = self._auth.metadata_blocking(self._channel, stale) if self._auth is not None else None
            try:
                responses = self._lease.LeaseKeepAlive(iter([rpc_pb2.LeaseKeepAliveRequest(ID=lease_id)]),
                                                       timeout=timeout or self.timeout, metadata=metadata)
                resp = next(iter(responses), None)
                break
            except grpc.RpcError as e:
                if attempt == 0 and metadata is not None and is_stale_token(e):
                    stale = metadata[0][1]
                    continue
                code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
                raise StoreUnavailable(f"etcd at {self.target}: lease keep-alive failed: {code.name}") from e
        if resp is None:
            raise StoreUnavailable(f"etcd at {self.target}: keep-alive stream closed")
        if resp.TTL <= 0:
            raise LeaseNotFound(f"lease {lease_id:x} not found")
        return float(resp.TTL)

    def close(self) -> None:
        self._channel.close()
