"""The servicers that used to catch store errors by hand now map them the one way
(`async with grpc_status.mapped(context, ...)`): a store outage is UNAVAILABLE naming the store, a
full store says so, a service's own request error is INVALID_ARGUMENT with its message. Stub
stores, a stub context that records the abort."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from persys._pb.persys.v1 import auth_pb2 as apb
from persys._pb.persys.v1 import certificates_pb2 as cpb
from persys._pb.persys.v1 import policy_pb2 as ppb
from persys.scheduler.rpc.authorization import CALLER, Caller
from persys.scheduler.rpc.client.auth import AuthService
from persys.scheduler.rpc.client.node_access import NodeAccessService
from persys.scheduler.rpc.client.policy import PolicyService
from persys.security.identity import from_subject
from persys.security.join_tokens import JoinTokenError
from persys.security.tokens import TokenError
from persys.store.base import StoreFull, StoreUnavailable
from tests.scheduler.test_service_errors import Aborted, Context


class Failing:
    """Any store-backed helper: every call raises `err`."""

    def __init__(self, err: Exception) -> None:
        self.err = err

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            raise self.err
        return call


async def aborted(call: Any) -> tuple[grpc.StatusCode, str]:
    token = CALLER.set(Caller(from_subject("admin")))
    try:
        with pytest.raises(Aborted) as caught:
            await call
    finally:
        CALLER.reset(token)
    return caught.value.code, caught.value.details


def node_access(err: Exception) -> NodeAccessService:
    service = NodeAccessService(None, None, Failing(ValueError("not reached")))  # type: ignore[arg-type]
    service.tokens = Failing(err)  # type: ignore[assignment]
    return service


CASES = [
    ("auth: list tokens, store down", lambda: AuthService(Failing(StoreUnavailable("etcd down")), None)
     .ListTokens(apb.ListTokensRequest(), Context()), grpc.StatusCode.UNAVAILABLE,
     "state store unavailable: etcd down"),
    ("auth: create token, bad request", lambda: AuthService(Failing(TokenError("role: unknown")), None)
     .CreateToken(apb.CreateTokenRequest(name="t", role="x"), Context()), grpc.StatusCode.INVALID_ARGUMENT,
     "role: unknown"),
    ("auth: audit, store full", lambda: AuthService(None, Failing(StoreFull("quota")))
     .ListAudit(apb.ListAuditRequest(), Context()), grpc.StatusCode.UNAVAILABLE, "state store full: quota"),
    ("node access: list join tokens, store down", lambda: node_access(StoreUnavailable("etcd down"))
     .ListJoinTokens(cpb.ListJoinTokensRequest(), Context()), grpc.StatusCode.UNAVAILABLE,
     "state store unavailable: etcd down"),
    ("policy: get, store down", lambda: PolicyService(None, Failing(StoreUnavailable("etcd down")),
                                                      require_identity=False)
     .GetPolicy(ppb.GetPolicyRequest(), Context()), grpc.StatusCode.UNAVAILABLE, "state store unavailable: etcd down"),
]


@pytest.mark.parametrize(("call", "code", "details"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_mapped_the_one_way(call: Any, code: grpc.StatusCode, details: str) -> None:
    got = await aborted(call())  # type: ignore[type-var]
    assert got == (code, details)


async def test_a_join_token_request_error_names_the_field() -> None:
    service = node_access(JoinTokenError("ttl_seconds: at most 7 days"))
    service.signer = type("Signer", (), {"ca_bundle": staticmethod(_ca)})()  # type: ignore[assignment]
    got = await aborted(service.CreateJoinToken(cpb.CreateJoinTokenRequest(ttl_seconds=10**9), Context()))
    assert got == (grpc.StatusCode.INVALID_ARGUMENT, "ttl_seconds: at most 7 days")


async def _ca() -> bytes:
    raise JoinTokenError("ttl_seconds: at most 7 days")  # before the pin is computed: the mapping is what is tested
