"""etcd v3 authentication for the etcd store: a user's password traded for a token.

etcd's Authenticate call returns a token that every later call carries as `token` metadata.
A simple token (etcd's default) expires after --auth-token-ttl seconds unused (300) and with
every etcd restart; a JWT at its expiry. Either way etcd then answers `invalid auth token`, and
the store authenticates again once and retries the call (`TokenKeeper.refresh`). Concurrent
callers that hit the same stale token share one new authentication: each costs etcd a bcrypt
comparison.

Errors from here never hold the password: etcd's own messages do not, and a `Password` prints
as `***`.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import grpc
import grpc.aio

from persys._pb.etcd.etcdserverpb import auth_pb2, auth_pb2_grpc
from persys.backend_access import tls_refusal_hint
from persys.credentials import Login
from persys.store.base import StoreError, StoreUnavailable

# What etcd answers when a token is no longer valid: the token expired (simple tokens idle for
# --auth-token-ttl, or an etcd restart), or the auth store changed since it was issued.
_STALE = ("invalid auth token", "revision of auth store is old", "user name is empty")

Metadata = tuple[tuple[str, str], ...]
log = logging.getLogger(__name__)


class StoreAccessDenied(StoreError):
    """etcd refused who we are or what we asked: wrong credentials, TLS identity or permissions."""


def _code_details(e: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """Code and details of an error from either gRPC API (grpc.aio's errors are no grpc.Call)."""
    if isinstance(e, grpc.aio.AioRpcError | grpc.Call):
        return e.code(), e.details() or ""
    return grpc.StatusCode.UNKNOWN, str(e)


def is_stale_token(e: grpc.RpcError) -> bool:
    return stale_token_text(_code_details(e)[1])


def stale_token_text(details: str) -> bool:
    """Whether etcd's message (an error's details, a watch's cancel reason) says the token is stale."""
    return any(s in details for s in _STALE)


def is_permission_denied(details: str) -> bool:
    return "permission denied" in details


def denied(target: str, user: str | None, details: str) -> StoreAccessDenied:
    who = f"user {user!r}" if user else "this client"
    return StoreAccessDenied(
        f"etcd at {target} denied {who} access to a key (permission denied): its role needs readwrite on the "
        "prefix /persys (etcdctl role grant-permission ROLE --prefix=true readwrite /persys; docs/security.md)"
        f" [{details}]")


def _auth_error(e: grpc.RpcError, target: str, user: str) -> StoreError:
    code, details = _code_details(e)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        hint = tls_refusal_hint(details, "etcd")
        if hint:
            return StoreAccessDenied(f"etcd at {target}: {hint} ({details})")
        return StoreUnavailable(f"etcd at {target} unavailable ({code.name}): {details}")
    if "authentication is not enabled" in details:
        return StoreAccessDenied(f"etcd at {target}: a user is configured ({user!r}) but etcd has authentication "
                                 "disabled; enable it (etcdctl auth enable) or drop --etcd-user")
    if "authentication failed" in details or code == grpc.StatusCode.INVALID_ARGUMENT:
        return StoreAccessDenied(f"etcd at {target}: authentication failed for user {user!r} (wrong user name or "
                                 "password; check --etcd-user and --etcd-password)")
    return StoreError(f"etcd at {target}: authenticating {user!r} failed ({code.name}): {details}")


class TokenKeeper:
    """The current token of one etcd user, shared by the store's calls and its lease thread."""

    def __init__(self, login: Login, target: str, timeout: float) -> None:
        self.login = login
        self.target = target
        self.timeout = timeout
        self._token: str | None = None
        self._guard = threading.Lock()  # the lease thread reads and renews it too
        self._renewing: asyncio.Lock | None = None
        self.authentications = 0

    @property
    def user(self) -> str:
        return self.login.user

    def _request(self) -> auth_pb2.AuthenticateRequest:
        return auth_pb2.AuthenticateRequest(name=self.login.user, password=self.login.password.reveal())

    def _store(self, token: str) -> str:
        with self._guard:
            self._token = token
            self.authentications += 1
        return token

    def current(self) -> str | None:
        with self._guard:
            return self._token

    async def metadata(self, channel: grpc.aio.Channel) -> Metadata:
        token = self.current()
        if token is None:
            token = await self.refresh(channel, None)
        return (("token", token),)

    async def refresh(self, channel: grpc.aio.Channel, stale: str | None) -> str:
        """A new token, unless another caller already replaced `stale` (then that one)."""
        if self._renewing is None:
            self._renewing = asyncio.Lock()
        async with self._renewing:
            token = self.current()
            if token is not None and token != stale:
                return token
            stub = auth_pb2_grpc.AuthStub(channel)
            for attempt in range(2):  # a refused password is read again once (a rotated file)
                try:
                    resp = await stub.Authenticate(self._request(), timeout=self.timeout)
                    return self._store(resp.token)
                except grpc.aio.AioRpcError as e:
                    if attempt == 0 and self._reread_after(e):
                        continue
                    raise _auth_error(e, self.target, self.login.user) from None
            raise AssertionError("unreachable")

    def _reread_after(self, e: grpc.RpcError) -> bool:
        """After a refused password: whether its source now holds another one (then use that)."""
        if "authentication failed" not in _code_details(e)[1]:
            return False
        fresh = self.login.current()
        if fresh is None:
            return False
        with self._guard:
            self.login = fresh
        log.info("etcd at %s refused user %r's password; its source holds a new one, trying that", self.target,
                 fresh.user)
        return True

    def metadata_blocking(self, channel: grpc.Channel, stale: str | None = None) -> Metadata:
        """For the lease thread (synchronous gRPC): the token, authenticating when it is missing or stale."""
        token = self.current()
        for attempt in range(2):
            if token is not None and token != stale:
                break
            try:
                token = self._store(auth_pb2_grpc.AuthStub(channel).Authenticate(
                    self._request(), timeout=self.timeout).token)
            except grpc.RpcError as e:
                if attempt == 0 and self._reread_after(e):
                    continue
                raise _auth_error(e, self.target, self.login.user) from None
        assert token is not None
        return (("token", token),)
