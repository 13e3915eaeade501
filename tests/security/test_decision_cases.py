"""Table-driven cases of the pure decisions: token validity and the gateway's route matching."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from persys.gateway.authorization import RouteTable
from persys.security.tokens import TokenRecord, new_token, parse, verify
from tests.cases import load

HERE = Path(__file__).parent
TOKEN_CASES: list[dict[str, Any]] = load(__file__, "token_cases.yaml")
ROUTE_CASES: list[dict[str, Any]] = load(__file__, "route_cases.yaml")
PATHS = {"/v1/workloads": {"get": {}}, "/v1/workloads:batch": {"post": {}},
         "/v1/workloads/{workload_id}/explain": {"get": {}}, "/v1/workloads/{workload_id}/logs": {"get": {}},
         "/v1/workloads/{workload_id}/{action}": {"post": {}}, "/v1/workloads/{workload_id}/exec": {"post": {}},
         "/v1/workloads/{workload_id}/files": {"get": {}, "put": {}}, "/v1/nodes/{node_id}": {"get": {}, "delete": {}},
         "/v1/nodes/{node_id}/drain": {"get": {}, "post": {}}}


@pytest.mark.parametrize("case", TOKEN_CASES, ids=[c["name"] for c in TOKEN_CASES])
def test_token_verdicts(case: dict[str, Any]) -> None:
    record = None
    if case["record"] != "absent":
        record = TokenRecord("t1", "ci", "viewer", hashlib.sha256(b"right").hexdigest(), 1000.0, 2000.0, "user:a",
                             revoked_at=1500.0 if case["record"] == "revoked" else 0.0)
    assert verify(record, case["secret"], case["now"]) == case["refusal"]


@pytest.mark.parametrize("case", ROUTE_CASES, ids=[f"{c['method']} {c['path']}" for c in ROUTE_CASES])
def test_route_matching(case: dict[str, Any]) -> None:
    assert RouteTable(PATHS).match(case["method"], case["path"]) == (case["template"], case["exists"])


def test_a_new_token_parses_and_only_its_hash_is_kept() -> None:
    secret, record = new_token("ci", "operator", 60, "user:a", 1000.0)
    parts = parse(secret)
    assert parts is not None and parts[0] == record.id
    assert parts[1] not in str(record.to_doc()) and verify(record, parts[1], 1000.0) == ""
    assert record.identity().principal == "user:ci" and record.identity().groups == ("persys:operators",)
    assert parse(secret + "x") is None and parse("persys_zz_" + parts[1]) is None
