"""Schemathesis against the real gateway (and a real scheduler behind it): every request it can
derive from `/openapi.json`, valid and invalid, must get an answer whose status the document lists,
and never a 5xx. Bounded: a fixed seed, few examples per operation, one worker.

No agent runs here on purpose: generated manifests are schema-valid, and on a node they would be
run (random `process` commands on this host). Without nodes they stay Pending.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e.harness import BIN
from tests.gateway.cluster import GatewayCluster, start_cluster

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    c = start_cluster(tmp_path_factory.mktemp("fuzz"), with_agent=False)
    try:
        yield c
    finally:
        c.stop()


def test_openapi_document_describes_every_request_body(cluster: GatewayCluster) -> None:
    doc = cluster.client().get("/openapi.json").json()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            bodiless = ("/cordon", "/uncordon", "/drain", "/recover", "/liveness/resume", "/move")
            if method == "post" and not path.endswith(bodiless) and "{action}" not in path:
                assert "requestBody" in op, f"POST {path} has no documented body"
    assert "WorkloadManifest" in doc["components"]["schemas"]


def test_schemathesis_finds_no_server_error_and_only_documented_statuses(cluster: GatewayCluster) -> None:
    p = subprocess.run(
        [str(BIN / "st"), "run", f"{cluster.url}/openapi.json",
         "--tls-verify", str(cluster.pki / "ca.crt"),
         "--request-cert", str(cluster.pki / "admin.crt"), "--request-cert-key", str(cluster.pki / "admin.key"),
         "--checks", "not_a_server_error,status_code_conformance",
         "--phases", "coverage,fuzzing", "--max-examples", "4", "--seed", "20240610", "--workers", "1",
         "--generation-deterministic", "--request-timeout", "30", "--no-color",
         # The SSE streams stay open by design (up to their `timeout`, 300 s unless given): a fuzzer
         # reading each to its end would wait for every generated request. Their parameters are
         # checked in tests/gateway/test_live_streams.py instead.
         "--exclude-path-regex", r"^/v1/(events/stream|watch/)"],
        capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-8000:] + p.stderr[-2000:]
