"""Pure decisions around OpenBao (bao_roles) and the certificate registry, table-driven from bao_cases/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.scheduler.access.certificates import CertRecord, status
from persys.security.bao_roles import (
    GROUP_PKI_ROLE,
    SetupError,
    check_host_patterns,
    group_role,
    pki_role,
    policy,
    role_for,
    sign_call,
)
from persys.security.cert_requests import IdentityRequest, identity_request
from persys.security.csr import new_key_and_csr
from persys.security.identity import Kind
from persys.security.pki import CertificateRequestError
from tests.cases import load

CASES = Path(__file__).parent / "bao_cases"


def _load(name: str) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = load(CASES, name)
    return cases


HOSTS = _load("host_patterns.yaml")
SIGNS = _load("sign_calls.yaml")
ROWS = _load("registry_status.yaml")
CHOICES = _load("role_choice.yaml")


@pytest.mark.parametrize("case", HOSTS, ids=[c["name"] for c in HOSTS])
def test_host_patterns(case: dict[str, Any]) -> None:
    if case.get("ok"):
        assert check_host_patterns(tuple(case["patterns"]), "--node-host") == tuple(case["patterns"])
    else:
        with pytest.raises(SetupError, match=case["error"]):
            check_host_patterns(tuple(case["patterns"]), "--node-host")


@pytest.mark.parametrize("case", SIGNS, ids=[c["name"] for c in SIGNS])
def test_sign_calls(case: dict[str, Any]) -> None:
    r = case["request"]
    groups = tuple(r.get("groups", ()))
    request = (IdentityRequest(f"user:{r['name']}", "u", (), groups) if groups
               else identity_request(r["role"], r["name"], tuple(r["hosts"]), ()))
    _, csr = new_key_and_csr("scheduler")  # what the CSR names never counts
    if "error" in case:
        with pytest.raises(CertificateRequestError, match=case["error"]):
            sign_call(csr, request, 60)
        return
    call = sign_call(csr, request, 60)
    want = case["expect"]
    assert call.role == want["role"]
    assert {k: call.body[k] for k in ("common_name", "alt_names", "ip_sans")} == {
        k: want[k] for k in ("common_name", "alt_names", "ip_sans")}
    assert call.body["ttl"] == "60s" and call.body["exclude_cn_from_sans"] is True


@pytest.mark.parametrize("case", CHOICES, ids=[c["name"] for c in CHOICES])
def test_role_choice(case: dict[str, Any]) -> None:
    kind, groups = Kind(case["kind"]), tuple(case["groups"])
    if "error" in case:
        with pytest.raises(CertificateRequestError, match=case["error"]):
            role_for(kind, groups)
    else:
        assert role_for(kind, groups) == case["role"]


def test_group_roles_fix_their_group_and_no_service_may_sign_them() -> None:
    for group, name in GROUP_PKI_ROLE.items():
        body = group_role(group)
        assert body["organization"] == [group] and body["allowed_domains"] == ["user:*"]
        assert body["use_csr_common_name"] is False and body["server_flag"] is False
        assert all(name not in policy(service, "m") for service in ("scheduler", "gateway"))


@pytest.mark.parametrize("case", ROWS, ids=[c["name"] for c in ROWS])
def test_registry_status(case: dict[str, Any]) -> None:
    rec = CertRecord("ab12", "node:a", signer="openbao", **case["record"])
    rows = status([rec], case["now"], include_expired=case.get("all", False))
    assert [r["state"] for r in rows] == ([case["state"]] if case["state"] else [])


def test_roles_never_take_names_from_the_csr_and_users_never_serve() -> None:
    for kind in (Kind.SCHEDULER, Kind.GATEWAY, Kind.NODE, Kind.USER):
        role = pki_role(kind, ("localhost",))
        assert role["use_csr_common_name"] is False and role["use_csr_sans"] is False
        assert role["server_flag"] is (kind is not Kind.USER)
    assert pki_role(Kind.USER, ("localhost",))["allowed_domains"] == ["user:*"]


def test_policies_are_least_privilege() -> None:
    gw = policy("gateway", "m")
    assert "m/sign/persys-gateway" in gw and "persys-node" not in gw and "persys-scheduler" not in gw
    sched = policy("scheduler", "m")
    assert "m/sign/persys-scheduler" in sched and "m/sign/persys-node" in sched and "persys-gateway" not in sched
