"""Persys Intelligence over gRPC (persys.v1.Intelligence, served by the gateway with
--grpc-listen), over a real mutual-TLS channel to a real gateway and scheduler (OS processes): a
viewer's certificate, and a viewer's token on a certificate without rights, are answered with the
REST answer's document; a node's certificate is refused (PERMISSION_DENIED), a wrong token
UNAUTHENTICATED, no certificate no connection; bad input INVALID_ARGUMENT naming the field;
nothing is written."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest

from persys._pb.persys.v1 import intelligence_pb2 as ipb
from persys._pb.persys.v1 import intelligence_pb2_grpc as ipb_grpc
from persys.security.permissions import GATEWAY_RPC_RULES, INTELLIGENCE, rest_rule
from tests.e2e.harness import persys
from tests.gateway.cluster import start_cluster

pytestmark = pytest.mark.e2e

# Each method and the REST route whose rule it shares.
ROUTES = {"WhyWorkload": "/v1/why/workloads/{workload_id}", "WhyNode": "/v1/why/nodes/{node_id}",
          "WhyCluster": "/v1/why/cluster", "ListInvestigations": "/v1/investigations", "Insights": "/v1/insights",
          "Rightsize": "/v1/rightsize/workloads/{workload_id}", "Forecast": "/v1/forecast/nodes/{node_id}"}


def test_every_method_has_its_rest_routes_rule() -> None:
    methods = {m.name for m in ipb.DESCRIPTOR.services_by_name["Intelligence"].methods}
    assert methods == set(ROUTES) and set(GATEWAY_RPC_RULES) == {INTELLIGENCE + m for m in methods}
    for m, route in ROUTES.items():
        assert GATEWAY_RPC_RULES[INTELLIGENCE + m] == rest_rule("GET", route), m


def issue_user(pki: Path, tmp: Path, name: str, *groups: str) -> tuple[Path, Path]:
    out = tmp / name
    subprocess.run(persys("certs", "issue", "--ca-dir", str(pki), "--role", "user", "--name", name,
                          *(a for g in groups for a in ("--group", g)), "--out", str(out)),
                   check=True, capture_output=True, timeout=60)
    return out / f"user-{name}.crt", out / f"user-{name}.key"


def channel(target: str, pki: Path, cert: tuple[Path, Path] | None) -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.crt").read_bytes(),
        private_key=cert[1].read_bytes() if cert else None, certificate_chain=cert[0].read_bytes() if cert else None)
    return grpc.aio.secure_channel(target, creds)


async def call(ch: grpc.aio.Channel, method: str, request: Any, token: str = "") -> dict[str, Any]:
    stub = ipb_grpc.IntelligenceStub(ch)
    md = (("authorization", f"Bearer {token}"),) if token else None
    answer = await getattr(stub, method)(request, timeout=60, metadata=md)
    return json.loads(answer.json)  # type: ignore[no-any-return]


async def code_of(ch: grpc.aio.Channel, method: str, request: Any, token: str = "") -> tuple[grpc.StatusCode, str]:
    try:
        await call(ch, method, request, token)
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


async def test_viewer_cert_and_token_are_answered_a_node_is_refused(tmp_path: Path) -> None:
    c = start_cluster(tmp_path, with_agent=False, gateway_args=("--grpc-listen", "127.0.0.1:0"))
    try:
        m = re.search(r"gateway gRPC \(Persys Intelligence\) on port (\d+)", c.gateway.text())
        assert m, c.gateway.text()[-2000:]
        target = f"127.0.0.1:{m.group(1)}"
        vera = issue_user(c.pki, tmp_path, "vera", "persys:viewers")
        nobody = issue_user(c.pki, tmp_path, "nemo")  # no group: no role
        node = next(((p, p.with_suffix(".key")) for p in sorted(c.pki.glob("*n1*.crt"))), None)
        assert node is not None, sorted(x.name for x in c.pki.iterdir())
        with c.client() as http:
            token = http.post("/v1/auth/tokens", json={"name": "tv", "role": "viewer"}).json()["token"]
            rest = http.get("/v1/why/cluster").json()

        async with channel(target, c.pki, vera) as ch:
            why = await call(ch, "WhyCluster", ipb.WhyRequest())
            assert why["subject"] == "cluster" and set(why) == set(rest), (set(why) ^ set(rest))
            assert why["evidence"]["documents"][0]["kind"] == "health"
            fc = await call(ch, "Forecast", ipb.ForecastRequest(since="1h", horizon="10m"))
            assert fc["verdict"] == "insufficient history" and fc["subject"] == "cluster"
            ins = await call(ch, "Insights", ipb.InsightsRequest())
            assert ins["recommendations"] == [] and "consolidation" in ins
            listed = await call(ch, "ListInvestigations", ipb.ListInvestigationsRequest(subject="cluster"))
            # One record for REST and gRPC: the admin's REST question and vera's gRPC one.
            assert [i["askedBy"] for i in listed["items"]][:2] == ["user:vera", "user:admin"], listed
            for method, req, field, code in (
                    ("Forecast", ipb.ForecastRequest(metric="gpu"), "metric", grpc.StatusCode.INVALID_ARGUMENT),
                    ("Forecast", ipb.ForecastRequest(since="1h", horizon="2h"), "horizon",
                     grpc.StatusCode.INVALID_ARGUMENT),
                    ("Rightsize", ipb.RightsizeRequest(workload="web", since="-1d"), "since",
                     grpc.StatusCode.INVALID_ARGUMENT),
                    ("WhyWorkload", ipb.WhyRequest(name=""), "name", grpc.StatusCode.INVALID_ARGUMENT),
                    ("WhyNode", ipb.WhyRequest(name="a/b"), "name", grpc.StatusCode.INVALID_ARGUMENT),
                    ("ListInvestigations", ipb.ListInvestigationsRequest(limit=501), "limit",
                     grpc.StatusCode.INVALID_ARGUMENT),
                    ("WhyWorkload", ipb.WhyRequest(name="ghost"), "ghost", grpc.StatusCode.NOT_FOUND)):
                got, details = await code_of(ch, method, req)
                assert got == code and field in details, (method, got, details)

        async with channel(target, c.pki, nobody) as ch:  # a user without a role, then a viewer's token on it
            got, details = await code_of(ch, "WhyCluster", ipb.WhyRequest())
            assert got == grpc.StatusCode.PERMISSION_DENIED and "may not get health" in details, details
            assert (await call(ch, "WhyCluster", ipb.WhyRequest(), token))["subject"] == "cluster"
            assert (await code_of(ch, "WhyCluster", ipb.WhyRequest(), "not-a-token"))[0] == \
                grpc.StatusCode.UNAUTHENTICATED
        async with channel(target, c.pki, None) as ch:  # no certificate: no TLS handshake
            assert (await code_of(ch, "WhyCluster", ipb.WhyRequest(), token))[0] == grpc.StatusCode.UNAVAILABLE

        async with channel(target, c.pki, node) as ch:  # a node's identity holds no client rights
            for method, req in (("WhyCluster", ipb.WhyRequest()), ("Insights", ipb.InsightsRequest()),
                                ("Forecast", ipb.ForecastRequest())):
                got, details = await code_of(ch, method, req)
                assert got == grpc.StatusCode.PERMISSION_DENIED and "no client rights" in details, (method, details)

        with c.client() as http:
            assert http.get("/v1/workloads").json() == []  # nothing was written
    finally:
        c.stop()
