"""Issue #30, finding 8, through a real gateway and scheduler (separate processes): a terminal
WebSocket from another site is refused (absent Origin and the gateway's own are not); failed
bearer-token attempts are answered 429 with Retry-After after ten from one source within a
minute, and each is in the audit log; `node revoke` refuses an id no node has unless --force;
`persysctl audit` shows method and route."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from persys.gateway.token_failures import LIMIT
from persys.security import peer_names
from tests.e2e.harness import ctl
from tests.gateway.cluster import GatewayCluster, start_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    c = start_cluster(tmp_path_factory.mktemp("edges"), with_agent=False)
    try:
        yield c
    finally:
        c.stop()


def _handshake(c: GatewayCluster, origin: str | None) -> tuple[int, str]:
    ctx = ssl.create_default_context(cafile=str(c.pki / "ca.crt"))
    ctx.load_cert_chain(str(c.pki / "admin.crt"), str(c.pki / "admin.key"))
    uri = c.url.replace("https://", "wss://") + "/v1/workloads/nosuch/terminal?command=sh"
    headers = {"Origin": origin} if origin is not None else None
    try:
        with connect(uri, ssl=ctx, server_hostname=peer_names.GATEWAY, open_timeout=30, origin=None,
                     additional_headers=headers):
            return 101, ""
    except InvalidStatus as err:
        return err.response.status_code, err.response.body.decode() if err.response.body else ""


def test_a_cross_site_terminal_is_refused(cluster: GatewayCluster) -> None:
    own = cluster.url  # https://127.0.0.1:PORT, what the browser would send from the gateway's pages
    for origin in ("https://evil.example", "null", "http://" + own.removeprefix("https://"),
                   own.replace("127.0.0.1", "127.0.0.2"), own + "0", "https://127.0.0.1"):
        status, body = _handshake(cluster, origin)
        assert status == 403, (origin, status, body)
        assert "Origin" in json.loads(body)["error"] and "cross-site WebSocket refused" in body, body
    for origin in (None, own, own.upper().replace("HTTPS", "https")):  # a CLI; the gateway itself
        status, body = _handshake(cluster, origin)
        assert status == 404 and "nosuch" in body, (origin, status, body)  # past the check: no such workload


def test_failed_bearer_tokens_are_limited_per_source_and_audited(cluster: GatewayCluster) -> None:
    anonymous = httpx.Client(base_url=cluster.url, verify=ssl.create_default_context(
        cafile=str(cluster.pki / "ca.crt")), timeout=30)
    with anonymous, cluster.client() as admin:
        for i in range(LIMIT):
            r = anonymous.get("/v1/workloads", headers={"authorization": f"Bearer guess-{i}"})
            assert r.status_code == 401, r.text
        r = anonymous.get("/v1/workloads", headers={"authorization": "Bearer guess-more"})
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["retry-after"]) <= 60 and "too many failed bearer-token attempts" in r.text
        assert admin.get("/v1/workloads").status_code == 200  # a certificate is not a token attempt
        records = [x for x in admin.get("/v1/audit", params={"who": "unauthenticated", "limit": 1000}).json()["items"]
                   if x["result"] == "401"]
        assert len(records) == LIMIT, records
        assert all(x["action"] == "GET /v1/workloads" and x["object"]["source"] == "127.0.0.1" for x in records)
        assert not any("guess" in json.dumps(x) for x in records)  # never the token itself
    listing = ctl("audit", "--who", "unauthenticated", env=cluster.ctl_env()).stdout
    assert "GET /v1/workloads" in listing, listing  # method and route, not "workloads"


def test_node_revoke_refuses_an_unknown_id_unless_forced(cluster: GatewayCluster, tmp_path: Path) -> None:
    env = cluster.ctl_env()
    p = ctl("node", "revoke", "n1x", env=env, check=False)
    assert p.returncode == 1 and "no node 'n1x' is known" in p.stdout + p.stderr, p.stdout + p.stderr
    assert "--force" in p.stdout + p.stderr
    p = ctl("node", "revoke", "n1x", "--force", "--reason", "reserved", env=env)
    assert "node/n1x revoked" in p.stdout
